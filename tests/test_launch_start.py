"""The launcher checks the dataset (importing and tokenizing for seconds, as each child does) once
per set of inputs; a broken dataset ends the start before anything runs
(tests/test_bad_input_processes.py)."""

from __future__ import annotations

import pytest

from streamrl.actors.prompt_data import PromptDataError
from streamrl.configs import load_config


def test_the_dataset_is_checked_once_per_set_of_inputs_and_again_after_an_edit(
    tmp_path, demo_policy, monkeypatch
):
    from streamrl.launch.dataset_check import check_dataset, stamp

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "12>", "answer": "21"}\n')
    cfg = load_config("demo_cpu", {"model.path": demo_policy, "data.path": str(data)}, env={})
    assert check_dataset(cfg) is True
    assert stamp(cfg).is_file()
    assert check_dataset(cfg) is False
    # an edit changes the stamp's name: checked again, and a broken row still fails
    data.write_text('{"prompt": "12>", "answer": "21"}\n{"answer": "no prompt"}\n')
    with pytest.raises(PromptDataError, match="row 2"):
        check_dataset(cfg)
    # so does another data section
    other = load_config(
        "demo_cpu",
        {"model.path": demo_policy, "data.path": str(data), "data.answer_key": "prompt"},
        env={},
    )
    assert stamp(other) != stamp(cfg)
    # a hub id is checked every time (no stamp)
    hub = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": "org/name"})})
    assert stamp(hub) is None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_staggered_actors_start_one_by_one_each_after_the_one_before_beats(
    tmp_path, demo_policy, demo_dataset
):
    import time
    import uuid

    from streamrl.launch.supervisor import Supervisor

    overrides = {
        "run.name": f"stagger-{uuid.uuid4().hex[:8]}",
        "run.dir": str(tmp_path / "run"),
        "model.path": demo_policy,
        "data.path": demo_dataset,
        "actor.staggered_start": True,
        "learner.cpus": None,
        "actor.cpus": None,
    }
    sup = Supervisor(load_config("demo_cpu", overrides, env={}), actors=3)
    try:
        sup.start()
        started = [len(sup.actors)]
        beating_when_added = []
        while len(sup.actors) < 3:
            before = len(sup.actors)
            sup.tick()
            if len(sup.actors) > before:
                newest_before = sup.actors[before - 1].name
                beating_when_added.append(bool(sup.redis.exists(sup.keys.actor(newest_before))))
                started.append(len(sup.actors))
            time.sleep(0.2)
    finally:
        sup.stop()
    assert started == [1, 2, 3]
    assert beating_when_added == [True, True]
