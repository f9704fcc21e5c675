"""Every learning test pins the recipe its threshold was measured with (tests/recipes.py): with the
schema's default of every knob that changes what a run trains set to another value, each learning
test's config resolves to the same settings and its learner steps the same learning rates.

Issue 48: ``learner.lr_scheduler: auto`` landed as a default and decayed the LoRA system test's LR
to 0 over its 100 steps; its threshold, measured at a constant LR, turned into a coin flip. No
training here: the configs are resolved, and the LR schedule stepped on one parameter.
"""

from __future__ import annotations

import importlib
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from streamrl.configs import Config
from streamrl.learner.engine import lr_schedule

TESTS = Path(__file__).parent
# The modules whose tests assert learning (a reward rise, a loss falling, a preference learned):
# found by what they define, so a new one is checked once it does; these must stay among them.
KNOWN = {"test_end_to_end", "test_learner_learns", "test_lora_system", "test_supervised_run",
         "test_system_vllm_hf"}  # fmt: skip

# Each knob that changes what a run trains, with another valid value for its default.
OTHER_DEFAULT: dict[str, Any] = {
    "run.seed": 12345,
    "run.max_steps": 7,
    "run.max_time_s": 5.0,
    "run.target_reward": 0.01,
    "run.target_window": 2,
    "rollout.group_size": 4,
    "rollout.max_new_tokens": 5,
    "rollout.max_prompt_tokens": 64,
    "rollout.temperature": 0.7,
    "rollout.top_p": 0.9,
    "rollout.top_k": 3,
    "rollout.stop": ["@"],
    "rollout.chat_template_kwargs": {"enable_thinking": False},
    "algo.max_staleness": 5,
    "algo.advantage": "drgrpo",
    "algo.adv_eps": 1e-3,
    "algo.std_threshold": 1e-3,
    "algo.skip_zero_variance": False,
    "algo.dynamic_sampling": True,
    "algo.dynamic_sampling_max_groups": 99,
    "algo.clip_low": 0.1,
    "algo.clip_high": 0.3,
    "algo.importance_sampling_level": "sequence",
    "algo.sequence_clip_low": 1e-3,
    "algo.sequence_clip_high": 2e-3,
    "algo.rho_max": 3.0,
    "algo.importance_correction": False,
    "algo.staleness_tighten": 0.1,
    "algo.proximal": "behaviour",
    "algo.aggregation": "seq_mean",
    "algo.constant_normalizer": 7,
    "algo.kl_coef": 0.05,
    "algo.reference_on": "actors",
    "algo.entropy_coef": 0.01,
    "learner.lr": 1.234e-5,
    "learner.betas": (0.8, 0.9),
    "learner.weight_decay": 0.01,
    "learner.warmup_steps": 3,
    "learner.lr_scheduler": "cosine",
    "learner.init_optimizer": "fresh",
    "learner.grad_clip": 0.5,
    "learner.groups_per_step": 3,
    "learner.updates_per_batch": 3,
    "learner.minibatches": 3,
    "supervised.epochs": 5,
    "supervised.batch_size": 3,
    "supervised.shuffle": False,
    "supervised.max_length": 33,
    "supervised.beta": 0.3,
    "supervised.loss": "ipo",
    "model.dtype": "bfloat16",
    "model.lora.rank": 2,
    "model.lora.alpha": 4.0,
    "model.lora.dropout": 0.1,
    "model.lora.target_modules": ["q_proj"],
    "actor.refill": False,
}
# (run.target_parts has no other default: the parts it names are the task's.)
# The fields of the training sections that do not change what is trained, and why.
NOT_TRAINING = {
    "supervised.path": "the dataset: each test names its own",
    "algo.staleness_auto": "read only under algo.max_staleness: auto, which a pinned integer bound rules out",
    "supervised.save_optimizer": "what the export holds",
    "model.lora.sync": "what travels to the actors; the policy they sample is the same",
    **dict.fromkeys(
        ["learner.micro_batch_tokens", "learner.logprob_chunk_tokens", "learner.packed_attention",
         "learner.zero_stage", "learner.offload_optimizer", "learner.gradient_checkpointing",
         "learner.ranks"],
        "the same arithmetic, grouped or placed otherwise (tests/test_learner_packing.py, "
        "test_learner_memory_knobs.py, test_learner_processes.py)",
    ),
    **dict.fromkeys(
        ["learner.peak_tflops", "learner.gpus", "learner.cpus", "learner.checkpoint_every",
         "learner.ack_policy", "learner.read_timeout_s", "learner.metrics_port",
         "learner.trusted_network", "learner.max_crashes", "learner.crash_window_s",
         "learner.commit_log"],
        "reporting, placement, persistence or supervision",
    ),
}  # fmt: skip
# RL recipes are compared on these knobs, supervised ones (one optimizer step a step, no
# rollouts, no target) on the rest
RL_ONLY = ("rollout.", "algo.", "actor.", "run.target", "learner.groups_per_step",
           "learner.updates_per_batch", "learner.minibatches")  # fmt: skip
SUPERVISED_ONLY = ("supervised.",)


def _section_class(path: list[str]) -> type:
    cls = Config
    for part in path:
        cls = cls.model_fields[part].annotation
    return cls


def _learning_modules() -> list[str]:
    defines = re.compile(r"^def learning_configs\(", re.M)
    return sorted(
        p.stem for p in TESTS.glob("test_*.py") if defines.search(p.read_text(encoding="utf-8"))
    )


def _import(name: str, monkeypatch):
    # the vLLM module skips itself on import outside the vLLM venv; its config needs no vLLM
    monkeypatch.setenv("STREAMRL_REQUIRE_VLLM", "1")
    return importlib.import_module(name)


@contextmanager
def _defaults(values: dict[str, Any]):
    """The schema with other defaults for ``values``' knobs (restored on exit)."""
    # each section class and its depth under Config (0)
    saved, depth = [], {Config: 0}
    for knob, value in values.items():
        *section, name = knob.split(".")
        cls = _section_class(section)
        field = cls.model_fields[name]
        saved.append((field, field.default, field.default_factory))
        if field.default_factory is not None:
            field.default_factory = lambda value=value: value
        else:
            field.default = value
        for i in range(1, len(section) + 1):
            outer = _section_class(section[:i])
            depth[outer] = max(depth.get(outer, 0), i)

    def rebuild() -> None:
        # the deepest sections first: each embeds the schemas of those below it as they were
        # when it was built, so model.lora rebuilt after model left model with the other
        # defaults for good (another test in the process then exported with lora alpha 4)
        for cls in sorted(depth, key=depth.__getitem__, reverse=True):
            cls.model_rebuild(force=True)

    rebuild()
    try:
        yield
    finally:
        for field, default, factory in saved:
            field.default, field.default_factory = default, factory
        rebuild()


def _knob(cfg: Config, knob: str) -> Any:
    value: Any = cfg
    for part in knob.split("."):
        value = getattr(value, part)
    return value


def _trained_knobs(cfg: Config) -> dict[str, Any]:
    """What ``cfg`` trains with: the knobs of its kind (RL or supervised); the adapters' only
    where there are adapters."""
    skip = RL_ONLY if cfg.supervised.path else SUPERVISED_ONLY
    knobs = {k: _knob(cfg, k) for k in OTHER_DEFAULT if not k.startswith(skip)}
    if not cfg.model.lora.rank:
        knobs = {
            k: v for k, v in knobs.items() if not k.startswith("model.lora.") or k.endswith("rank")
        }
    return knobs


def _learning_rates(cfg: Config) -> list[float]:
    """The LR of each optimizer step the learner takes (learner.engine.lr_schedule), over twice
    the run's steps (or 20 without a limit)."""
    lc = cfg.learner
    if cfg.supervised.path:
        # one optimizer step a step (learner.supervised)
        lc = lc.model_copy(update={"minibatches": 1, "updates_per_batch": 1})
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([parameter], lr=lc.lr)
    schedule = lr_schedule(lc, optimizer, cfg.run.max_steps)
    rates = []
    for _ in range(2 * (cfg.run.max_steps or 10) * lc.versions_per_batch):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return rates


def _resolved(tmp_path: Path, monkeypatch) -> dict[str, Config]:
    configs = {}
    for name in _learning_modules():
        for label, cfg in _import(name, monkeypatch).learning_configs(tmp_path).items():
            configs[f"{name}:{label}"] = cfg
    return configs


def _moved(tmp_path: Path, monkeypatch, defaults: dict[str, Any]) -> dict[str, dict]:
    """Per learning config, what other schema ``defaults`` change in it: the knobs (as (was,
    now)) and ``"lr"`` when the learner's LR schedule differs."""
    real = _resolved(tmp_path, monkeypatch)
    with _defaults(defaults):
        other = _resolved(tmp_path, monkeypatch)
    moved = {}
    for name, cfg in real.items():
        was, now = _trained_knobs(cfg), _trained_knobs(other[name])
        changes = {k: (was[k], now[k]) for k in was if was[k] != now[k]}
        if _learning_rates(other[name]) != _learning_rates(cfg):
            changes["lr"] = "another schedule"
        if changes:
            moved[name] = changes
    return moved


def test_the_other_defaults_leave_no_trace_in_the_schema():
    """Every other test in the process loads configs after these checks: a section rebuilt in the
    wrong order kept the other defaults (an export there built LoRA with alpha 4)."""
    # a value in each section, so that each is validated by the schema its parent embeds (an
    # absent section is its own class's default, which a stale parent schema does not show)
    given = {section: {} for section in ("algo", "learner", "rollout", "supervised")}
    given["model"] = {"lora": {"rank": 8}}
    before = Config.model_validate(given).model_dump()
    with _defaults(OTHER_DEFAULT):
        assert Config.model_validate(given).model_dump() != before
    assert Config.model_validate(given).model_dump() == before


def test_the_learning_tests_are_found_by_what_they_define():
    assert KNOWN <= set(_learning_modules())


def test_every_field_of_the_training_sections_is_a_knob_or_said_not_to_train():
    fields = {
        f"{'.'.join(path)}.{name}"
        for path in (["algo"], ["learner"], ["rollout"], ["supervised"], ["model", "lora"])
        for name in _section_class(path).model_fields
    }
    assert fields - set(OTHER_DEFAULT) - set(NOT_TRAINING) == set()
    assert not set(OTHER_DEFAULT) & set(NOT_TRAINING)
    for knob, value in OTHER_DEFAULT.items():
        *section, name = knob.split(".")
        field = _section_class(section).model_fields[name]
        default = field.default_factory() if field.default_factory else field.default
        assert value != default, f"{knob}: its other default is the default"


@pytest.mark.parametrize(
    "defaults",
    [
        # the LoRA system test's coin: the scheduler's default alone, as linear and as constant
        {"learner.lr_scheduler": "linear", "run.max_steps": 7},
        {"learner.lr_scheduler": "constant"},
        OTHER_DEFAULT,
    ],
    ids=["linear", "constant", "every-knob"],
)
def test_other_schema_defaults_change_nothing_a_learning_test_trains_with(
    tmp_path, monkeypatch, defaults
):
    assert _moved(tmp_path, monkeypatch, defaults) == {}


def test_a_learning_test_that_leaves_the_scheduler_to_its_default_is_caught(tmp_path, monkeypatch):
    module = _import("test_lora_system", monkeypatch)
    recipe = {k: v for k, v in module.RECIPE.items() if k != "learner.lr_scheduler"}
    monkeypatch.setattr(module, "RECIPE", recipe)
    moved = _moved(tmp_path, monkeypatch, {"learner.lr_scheduler": "constant"})
    # auto decays over the run's 100 steps; a constant default would not
    assert moved == {
        "test_lora_system:lora": {
            "learner.lr_scheduler": ("auto", "constant"),
            "lr": "another schedule",
        }
    }
