"""Per-actor engines (``actor.engines``): the supervisor hands each actor its engine, the learner
publishes in a dtype every engine of the run can take, and a run without vLLM refuses to start one."""

from __future__ import annotations

import importlib.util
import shutil

import pytest
import torch

from streamrl.configs import load_config
from streamrl.weightsync.publisher import transfer_dtype


def test_actor_i_runs_engines_i_mod_len_and_the_actor_reads_it_as_actor_engine(tmp_path):
    from streamrl.launch.supervisor import Supervisor

    overrides = [f"run.dir={tmp_path / 'run'}", "actor.engines=[vllm, hf]", "actor.engine=hf"]
    cfg = load_config(None, overrides, env={})
    # `true` stands in for the actor program: what is checked is the command each actor gets
    sup = Supervisor(cfg, actors=0, python=shutil.which("true"))
    sup.log_dir.mkdir(parents=True)
    for _ in range(3):
        sup._add_actor()
    for child in sup.actors:
        child.proc.wait(timeout=10)
    engines = []
    for child in sup.actors:
        # what `python -m streamrl.actors` parses: everything after --actor-id ID
        actor_overrides = child.argv[child.argv.index("--actor-id") + 2 :]
        engines.append(load_config(None, actor_overrides, env={}).actor.engine)
    assert engines == ["vllm", "hf", "vllm"]


def test_without_engines_every_actor_keeps_actor_engine(tmp_path):
    cfg = load_config(None, ["actor.engine=vllm"], env={})
    assert [cfg.actor.engine_of(i) for i in range(3)] == ["vllm"] * 3
    assert cfg.actor.engines_in_use == {"vllm"}


def test_an_empty_engines_list_is_refused():
    from streamrl.configs import ConfigError

    with pytest.raises(ConfigError, match="actor.engines"):
        load_config(None, ["actor.engines=[]"], env={})


@pytest.mark.parametrize(
    ("overrides", "dtype"),
    [
        # both engines compute in float32 on CPU
        (["actor.engines=[vllm, hf]"], torch.float32),
        # an hf engine on a GPU computes in bfloat16 (auto): alone, it gets bfloat16
        (["actor.engines=[hf]", "actor.device=cuda:0"], torch.bfloat16),
        # next to the vLLM CPU build (float32) the publish stays float32 for it
        (["actor.engines=[vllm, hf]", "actor.device=cuda:0"], torch.float32),
        # an explicit model dtype is what every engine computes in
        (["actor.engines=[vllm, hf]", "model.dtype=bfloat16"], torch.bfloat16),
        # an explicit weightsync.dtype wins
        (["actor.engines=[vllm, hf]", "weightsync.dtype=float16"], torch.float16),
    ],
)
def test_the_published_dtype_suits_every_engine_of_the_run(overrides, dtype, monkeypatch):
    # the learner's host: vLLM would run its CPU build
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = load_config(None, overrides, env={})
    assert transfer_dtype(cfg.weightsync, cfg.model, cfg.actor) == dtype


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_run_with_a_vllm_actor_refuses_to_start_without_vllm(tmp_path):
    from streamrl.actors.engines.vllm.engine import VLLMUnavailable
    from streamrl.launch.supervisor import Supervisor

    overrides = [f"run.dir={tmp_path / 'run'}", "actor.engines=[hf, vllm]"]
    sup = Supervisor(load_config(None, overrides, env={}), actors=2)
    with pytest.raises(VLLMUnavailable, match=".venv-vllm"):
        sup.start()
    assert sup.learner is None and not sup.actors
