"""`streamrl plot RUN_DIR`: the PNGs draw exactly the learner's step rows."""

from __future__ import annotations

import json
import sys

import pytest

from streamrl.launch import plot


def _rows() -> list[dict]:
    rows = []
    for k in range(1, 7):
        row = {
            "step": k,
            "time": 1000.0 + 1.5 * k,
            "reward_mean": 0.1 * k,
            "reward_parts": {"exact": 0.05 * k, "format": 1.0 - 0.1 * k},
            "kl": 0.001 * k,
            "entropy": 3.0 - 0.1 * k,
            "tokens_per_s": 100.0 + k,
            "staleness_mean": 0.5 * (k % 3),
            "staleness_max": k % 3,
            "wait_s": 0.25,
            "step_s": 1.0 + 0.01 * k,
            "is_ess": 1.0 - 0.02 * k,
            "behaviour_kl": 1e-4 * k,
            "is_truncated_fraction": 0.01 * k,
            "stale_token_fraction": 0.03 * (k % 2),
            "learner_idle_fraction": 0.2,
        }
        rows.append(row)
    # a step that trained nothing has no kl or entropy: the line skips it
    del rows[3]["kl"], rows[3]["entropy"]
    return rows


def _drawn(fig) -> dict[str, dict[str, tuple[list, list]]]:
    return {
        ax.get_title(): {
            line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
            for line in ax.get_lines()
        }
        for ax in fig.axes
    }


@pytest.mark.parametrize("x", ["step", "wall_s"])
def test_every_panel_draws_the_step_rows_values_against_steps_and_wall_time(x):
    rows = _rows()
    drawn = _drawn(plot.figure(rows, x))
    # wall time from the run's start: the first row's end less its wait and step time
    start = 1001.5 - 0.25 - 1.01
    xs = [r["step"] if x == "step" else r["time"] - start for r in rows]
    assert drawn["reward"]["reward"] == (xs, [r["reward_mean"] for r in rows])
    assert drawn["reward"]["format"] == (xs, [r["reward_parts"]["format"] for r in rows])
    assert drawn["reward"]["exact"] == (xs, [r["reward_parts"]["exact"] for r in rows])
    kept = [i for i, r in enumerate(rows) if "kl" in r]
    assert drawn["KL"]["kl"] == ([xs[i] for i in kept], [rows[i]["kl"] for i in kept])
    assert drawn["entropy"]["entropy"][1] == [rows[i]["entropy"] for i in kept]
    assert drawn["KL"]["KL(mu || pi_prox)"] == (xs, [r["behaviour_kl"] for r in rows])
    off_policy = drawn["off-policy (share)"]
    assert off_policy["IS ESS"] == (xs, [r["is_ess"] for r in rows])
    assert off_policy["at the IS cap"][1] == [r["is_truncated_fraction"] for r in rows]
    assert off_policy["stale tokens"][1] == [r["stale_token_fraction"] for r in rows]
    assert off_policy["learner idle"][1] == [0.2] * len(rows)
    assert drawn["tokens/s trained"]["tokens/s"] == (xs, [r["tokens_per_s"] for r in rows])
    assert drawn["staleness (versions)"]["max"][1] == [float(r["staleness_max"]) for r in rows]
    assert drawn["time per phase (s)"]["training"] == (xs, [r["step_s"] for r in rows])
    assert drawn["time per phase (s)"]["waiting for data"][1] == [0.25] * len(rows)


def test_the_command_writes_both_pngs_and_names_the_extra_without_matplotlib(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "learner_steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    assert plot.main([str(tmp_path)]) == 0
    for name in ("steps.png", "wall_time.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.main([str(tmp_path / "nowhere")]) == 2
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert plot.main([str(tmp_path)]) == 2
    assert "pip install 'streamrl[plot]'" in capsys.readouterr().err
