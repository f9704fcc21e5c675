"""The launcher starts its children before it checks the dataset (the check imports and tokenizes
for seconds, as each child does): a broken dataset still ends the start with the error naming file
and row, and leaves no child and no Redis running."""

from __future__ import annotations

import uuid

import pytest
import redis

from streamrl.actors.prompts import PromptDataError
from streamrl.configs import load_config


def test_a_broken_dataset_stops_the_children_already_started_and_names_the_row(
    tmp_path, demo_policy
):
    from streamrl.launch.supervisor import Supervisor

    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "12>", "answer": "21"}\n{"answer": "no prompt"}\n')
    cfg = load_config(
        "demo_cpu",
        {
            "run.name": f"start-{uuid.uuid4().hex[:8]}",
            "run.dir": str(tmp_path / "run"),
            "model.path": demo_policy,
            "data.path": str(data),
        },
        env={},
    )
    # stands in for the interpreter: the children are up until SIGTERM, whatever they would do
    stand_in = tmp_path / "python"
    stand_in.write_text("#!/bin/sh\ntrap 'exit 0' TERM\nwhile :; do sleep 0.1; done\n")
    stand_in.chmod(0o700)
    sup = Supervisor(cfg, actors=2, python=str(stand_in))
    with pytest.raises(PromptDataError, match=r"train\.jsonl.*2|2.*train\.jsonl"):
        sup.start()
    children = [sup.learner, *sup.actors]
    assert len(children) == 3
    assert all(child.proc.poll() is not None for child in children)
    # stopped: EmbeddedRedis.stop waits for the server's exit, then lets go of it
    assert sup.redis_server.proc is None
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=sup.redis_server.port, socket_connect_timeout=2).ping()


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
