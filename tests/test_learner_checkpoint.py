"""Checkpoint folders: a re-save of the same step never touches the one ``latest`` names, the last
two are kept, and a save that dies half-way leaves ``latest`` loadable."""

from __future__ import annotations

import pytest
from test_learner_sync import learner_config

from streamrl.learner import checkpoint

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def learner(redis_cfg, demo_policy):
    from streamrl.learner.grpo import GRPO

    learner = GRPO(learner_config(redis_cfg, demo_policy))
    yield learner
    learner.close()


def _folders(root) -> list[str]:
    return sorted(p.name for p in root.glob("step-*"))


def test_a_resave_at_the_same_step_keeps_latest_and_the_last_two(learner, tmp_path):
    root = tmp_path / "checkpoints"
    first = checkpoint.save(learner.engine, root, 4, {"version": 4}, 0)
    again = checkpoint.save(learner.engine, root, 4, {"version": 4, "unacked": ["x"]}, 0)
    assert first != again and first.exists() and checkpoint.latest(root) == again.resolve()
    assert checkpoint.step_of(again) == checkpoint.step_of(first) == 4
    checkpoint.save(learner.engine, root, 5, {"version": 5}, 0)
    assert _folders(root) == [again.name, "step-00000005.0"]
    assert checkpoint.load(learner.engine, root, 0)["version"] == 5


def test_a_resave_that_fails_half_way_leaves_latest_loadable(learner, tmp_path):
    root = tmp_path / "checkpoints"
    good = checkpoint.save(learner.engine, root, 4, {"version": 4}, 0)
    # A client state that cannot be pickled: DeepSpeed raises in the middle of writing the folder,
    # as a SIGKILL during the re-save in GRPO.close() would stop it.
    with pytest.raises(Exception):  # noqa: B017 - whatever DeepSpeed's torch.save raises
        checkpoint.save(learner.engine, root, 4, {"version": 4, "bad": lambda: None}, 0)
    assert checkpoint.latest(root) == good.resolve() and good.exists()
    assert checkpoint.load(learner.engine, root, 0)["version"] == 4


# ----- what a resume reads: only a checkpoint beside ``latest``, RNG state as data -------------


def test_latest_leading_out_of_the_checkpoints_folder_is_refused_before_anything_loads(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    (root / "step-00000002.0").mkdir(parents=True)
    (root / "latest").symlink_to("step-00000002.0")
    assert checkpoint.latest(root) == (root / "step-00000002.0").resolve()
    planted = tmp_path / "planted" / "step-00000009.0"
    planted.mkdir(parents=True)
    (root / "step-00000003.0").symlink_to(planted)
    for target in (str(planted), "../../planted/step-00000009.0", "step-00000003.0", "nowhere"):
        (root / "latest").unlink()
        (root / "latest").symlink_to(target)
        # no engine needed: it refuses before DeepSpeed unpickles anything
        with pytest.raises(RuntimeError, match="not at a checkpoint folder"):
            checkpoint.load(None, root, 0)


def test_a_checkpoint_folder_another_user_could_write_is_not_loaded(tmp_path):
    from streamrl.configs.errors import ConfigError

    root = tmp_path / "checkpoints"
    folder = root / "step-00000002.0"
    folder.mkdir(parents=True)
    (root / "latest").symlink_to(folder.name)
    folder.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by"):
        checkpoint.load(None, root, 0)


class _Planted:
    """A pickle that runs code when loaded: what another user's rng file could hold."""

    def __init__(self, flag):
        self.flag = str(flag)

    def __reduce__(self):
        return (open, (self.flag, "w"))


def test_the_rng_state_is_read_back_as_data_and_a_pickle_is_never_run(tmp_path):
    import random

    import numpy as np
    import torch

    rng = tmp_path / "rng-0.pt"
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    checkpoint.save_rng(rng)
    drawn = (random.random(), float(np.random.normal()), float(torch.rand(1)))
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    assert checkpoint.restore_rng(rng)
    assert (random.random(), float(np.random.normal()), float(torch.rand(1))) == drawn

    flag = tmp_path / "ran"
    torch.save({"torch": _Planted(flag)}, rng)
    assert not checkpoint.restore_rng(rng)
    assert not flag.exists()
