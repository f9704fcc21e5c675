"""Version numbers stay unique per run across learner restarts (learner.lineage)."""

from __future__ import annotations

import json

from streamrl.learner.lineage import logged_version, resume_version


def test_a_restart_after_later_versions_were_announced_numbers_on_above_them():
    # killed at version 10 with its checkpoint at 6: the checkpoint's weights become version 11
    assert resume_version(6, 10) == 11
    # nothing announced past the checkpoint: its own number still names exactly these weights
    assert resume_version(6, 6) == 6
    assert resume_version(6, 0) == 6
    assert resume_version(0, 0) == 0


def test_every_version_of_a_chain_of_restarts_names_one_set_of_weights():
    """Lives that each train a few steps past their checkpoint and die; a version number may be
    announced again only for the very same weights."""
    weights_of: dict[int, str] = {}
    high, checkpoint = 0, (0, "initial")
    # (steps trained, checkpoint after that many of them; 0 = none) per life
    for life, (trained, saved_after) in enumerate([(5, 3), (4, 1), (2, 2), (6, 0), (3, 3)]):
        version = resume_version(checkpoint[0], high)
        assert weights_of.setdefault(version, checkpoint[1]) == checkpoint[1], (life, version)
        for step in range(1, trained + 1):
            version += 1
            weights = f"life {life} step {step}"
            assert weights_of.setdefault(version, weights) == weights, (life, version)
            if step == saved_after:
                checkpoint = (version, weights)
        high = max(high, version)


def test_the_step_log_counts_as_announced_and_a_torn_last_line_is_skipped(tmp_path):
    assert logged_version(tmp_path) == 0
    rows = [{"step": 1, "version": 1}, {"step": 2, "version": 4}, {"step": 3, "version": 3}]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "vers'
    (tmp_path / "learner_steps.jsonl").write_text(text)
    assert logged_version(tmp_path) == 4
