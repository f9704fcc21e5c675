"""learner.init_optimizer: the warm start's AdamW state, saved next to the policy, continued by the
DeepSpeed ZeRO-2 learner on one rank and on two (real engines under torchrun, on the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from streamrl.examples.reverse_digits.assets import build_policy
from streamrl.learner import init_optimizer
from streamrl.policy.load import load_policy

ROOT = Path(__file__).resolve().parents[1]
LR, BETAS, WARM_STEPS = 3e-4, (0.9, 0.99), 3
TIMEOUT_S = 180

# Each rank: the learner's engine on the policy, init_optimizer.start, every parameter's full
# moments (DeepSpeed's all-reduce of the rank fragments) and its own fragment's size, then one
# engine step on a fixed batch; rank 0 writes the moments and the weights after the step.
HARNESS = """
import json, sys, torch
torch.set_num_threads(1)
from deepspeed.utils import safe_get_full_optimizer_state
from streamrl.configs.schema import LearnerConfig
from streamrl.learner import init_optimizer
from streamrl.learner.engine import build_engine, init_distributed, mark_micro_batch, set_micro_batches
from streamrl.policy.load import load_policy
policy, out, learner = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
rank, world = init_distributed()
engine = build_engine(LearnerConfig(**learner), load_policy(policy), world)
started = init_optimizer.start(engine, policy, learner.get("init_optimizer", "auto"))
params = init_optimizer.trainable(engine.module)
loaded = {k: {n: safe_get_full_optimizer_state(p, k) for n, p in params.items()}
          for k in init_optimizer.MOMENTS} if "fresh AdamW" not in started else {}
owned = sum(p._hp_mapping.hp_fragment.numel() for p in params.values() if p._hp_mapping is not None)
ids = torch.tensor([[10 + (7 * i + j) % 60 for j in range(6)] for i in range(4)])
set_micro_batches(engine, 1)
mark_micro_batch(engine, 0, 1)
engine.backward(engine(input_ids=ids, labels=ids).loss)
engine.step()
sizes = [None] * world
torch.distributed.all_gather_object(sizes, owned)
if rank == 0:
    torch.save({"started": started, "loaded": loaded, "owned": sizes,
                "weights": {n: p.detach().clone() for n, p in params.items()}}, out)
# an exit with the gloo group still up can abort in its threads' teardown ("terminate called
# without an active exception", seen once in 2-rank runs on 2 cores)
torch.distributed.barrier()
torch.distributed.destroy_process_group()
"""


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return env


def _run_ranks(tmp_path: Path, policy: Path, ranks: int, **learner) -> dict:
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    out = tmp_path / f"out-{ranks}.pt"
    settings = {"lr": LR, "betas": list(BETAS), "grad_clip": 0.0, **learner}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(ranks), str(script), str(policy), str(out), json.dumps(settings)]  # fmt: skip
    proc = subprocess.run(
        cmd, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


def _reference_step(policy: Path, moments: init_optimizer.Moments | None) -> dict:
    """The same step with a plain torch AdamW over the policy, continuing ``moments`` (None: fresh)."""
    model = load_policy(policy).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=0.0)
    if moments is not None:
        for name, param in init_optimizer.trainable(model).items():
            optimizer.state[param] = {
                "step": torch.tensor(float(moments.step)),
                **{k: v.clone() for k, v in moments.tensors[name].items()},
            }
    ids = torch.tensor([[10 + (7 * i + j) % 60 for j in range(6)] for i in range(4)])
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    return {n: p.detach().clone() for n, p in init_optimizer.trainable(model).items()}


def _max_diff(a: dict, b: dict) -> float:
    return max((a[n].double() - b[n].double()).abs().max().item() for n in b)


@pytest.fixture(scope="module")
def warmed(tmp_path_factory) -> Path:
    """A demo policy warmed a few steps, its AdamW state saved next to it."""
    path = tmp_path_factory.mktemp("warm") / "policy"
    return build_policy(path, warm_start_steps=WARM_STEPS, warm_start_batch=8)


def test_the_builder_saves_the_warm_starts_adamw_and_read_returns_it(warmed):
    moments = init_optimizer.read(warmed)
    model = load_policy(warmed)
    params = init_optimizer.trainable(model)
    assert moments.step == WARM_STEPS and moments.betas == BETAS and moments.eps == 1e-8
    assert set(moments.tensors) == set(params)
    assert all(
        m["exp_avg_sq"].min() >= 0 and m["exp_avg"].abs().max() > 0
        for m in moments.tensors.values()
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS)
    assert init_optimizer.mismatch(moments, params, optimizer) is None


def test_moments_that_do_not_fit_the_learners_optimizer_are_refused_with_the_reason(warmed):
    moments = init_optimizer.read(warmed)
    model = load_policy(warmed)
    params = init_optimizer.trainable(model)
    other_betas = torch.optim.AdamW(model.parameters(), betas=(0.9, 0.999))
    assert "betas" in init_optimizer.mismatch(moments, params, other_betas)
    other_eps = torch.optim.AdamW(model.parameters(), betas=BETAS, eps=1e-6)
    assert "eps" in init_optimizer.mismatch(moments, params, other_eps)
    optimizer = torch.optim.AdamW(model.parameters(), betas=BETAS)
    fewer = {n: p for n, p in params.items() if "lm_head" not in n and "norm" not in n}
    assert "names differ" in init_optimizer.mismatch(moments, fewer, optimizer)
    name = next(iter(params))
    reshaped = {**params, name: torch.zeros(3, 3)}
    assert "shape" in init_optimizer.mismatch(moments, reshaped, optimizer)


def test_a_file_that_is_not_a_saved_adamw_state_is_a_clear_error(tmp_path):
    assert init_optimizer.read(tmp_path) is None
    (tmp_path / init_optimizer.FILE).write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="not an AdamW state saved by streamrl"):
        init_optimizer.read(tmp_path)
    torch.save({"format": "something else"}, tmp_path / init_optimizer.FILE)
    with pytest.raises(ValueError, match="format"):
        init_optimizer.read(tmp_path)


def test_save_refuses_an_optimizer_that_never_stepped(tmp_path):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="no AdamW state"):
        init_optimizer.save(tmp_path, model, torch.optim.AdamW(model.parameters()))


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT_S)
@pytest.mark.parametrize("ranks", [1, 2])
def test_zero2_ranks_hold_exactly_the_saved_moments_and_step_as_adamw_continuing_them(
    warmed, tmp_path, ranks
):
    moments = init_optimizer.read(warmed)
    result = _run_ranks(tmp_path, warmed, ranks)
    assert "step 3" in result["started"]
    # each rank owns a share of the fp32 state; together, exactly the saved moments
    params = init_optimizer.trainable(load_policy(warmed))
    assert sum(result["owned"]) == sum(p.numel() for p in params.values())
    assert all(size > 0 for size in result["owned"])
    for key in init_optimizer.MOMENTS:
        for name, saved in ((n, m[key]) for n, m in moments.tensors.items()):
            assert torch.equal(result["loaded"][key][name].double(), saved.double()), (key, name)
    carried, fresh = _reference_step(warmed, moments), _reference_step(warmed, None)
    # Same gradient and the same elementwise AdamW update on the flat partition as per tensor: the
    # weights agree to the float32 rounding of the final add, a few ulps of the largest weight.
    largest = max(p.abs().max().item() for p in carried.values())
    tolerance = 4 * torch.finfo(torch.float32).eps * largest
    assert _max_diff(result["weights"], carried) <= tolerance
    # a fresh AdamW's first step differs by far more: the test sees which state was continued
    assert _max_diff(result["weights"], fresh) > 100 * tolerance


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_other_betas_or_init_optimizer_fresh_start_a_fresh_adamw_and_say_why(warmed, tmp_path):
    result = _run_ranks(tmp_path, warmed, 1, betas=[0.9, 0.999])
    assert "fresh AdamW" in result["started"] and "betas" in result["started"]
    fresh = _reference_step(warmed, None)
    largest = max(p.abs().max().item() for p in fresh.values())
    # the step a fresh AdamW with betas (0.9, 0.999) takes is the same first step: m/sqrt(v) = sign(g)
    assert _max_diff(result["weights"], fresh) <= 4 * torch.finfo(torch.float32).eps * largest
    result = _run_ranks(tmp_path, warmed, 1, init_optimizer="fresh")
    assert "init_optimizer: fresh" in result["started"]
