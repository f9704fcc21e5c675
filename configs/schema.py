"""The whole config of a run: every section, composed, and the checks that span sections.

Each section lives in the module of the component it configures (``run``, ``broker``, ``model``,
``data``, ``rollout``, ``reward``, ``actor``, ``learner``, ``weightsync``); every knob is documented
there, once, with its default. Sections follow the data path: rollout/actor -> broker ->
learner/algo -> weightsync -> back to the actors. This module is also where callers import the
sections from.
"""

from __future__ import annotations

import inspect

from pydantic import Field, model_validator

from streamrl.configs.actor import ENGINE_PLACEMENT, ActorConfig
from streamrl.configs.broker import BrokerConfig
from streamrl.configs.data import DataConfig
from streamrl.configs.learner import AlgoConfig, LearnerConfig, SupervisedConfig
from streamrl.configs.model import LoraConfig, ModelConfig
from streamrl.configs.reward import BUILTIN_REWARD_RANGES, RewardConfig, RewardSpec
from streamrl.configs.rollout import AgentConfig, EnvConfig, RolloutConfig
from streamrl.configs.run import MetricsConfig, RunConfig
from streamrl.configs.section import Section, check_indices
from streamrl.configs.weightsync import DEVICE_IPC_TRANSPORTS, WeightSyncConfig

__all__ = [
    "ActorConfig",
    "AgentConfig",
    "AlgoConfig",
    "BUILTIN_REWARD_RANGES",
    "BrokerConfig",
    "Config",
    "DEVICE_IPC_TRANSPORTS",
    "DataConfig",
    "ENGINE_PLACEMENT",
    "EnvConfig",
    "LearnerConfig",
    "LoraConfig",
    "MetricsConfig",
    "ModelConfig",
    "RewardConfig",
    "RewardSpec",
    "RolloutConfig",
    "RunConfig",
    "Section",
    "SupervisedConfig",
    "WeightSyncConfig",
]


class Config(Section):
    """The whole config of a run."""

    run: RunConfig = Field(default_factory=RunConfig)
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    weightsync: WeightSyncConfig = Field(default_factory=WeightSyncConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    supervised: SupervisedConfig = Field(default_factory=SupervisedConfig)

    @model_validator(mode="after")
    def _placement(self) -> Config:
        learner, actor = self.learner, self.actor
        for key, cpus in (("learner.cpus", learner.cpus), ("actor.cpus", actor.cpus)):
            if isinstance(cpus, list):
                check_indices(key, cpus, "CPU")
        if learner.gpus is not None:
            check_indices("learner.gpus", learner.gpus)
            if len(learner.gpus) != learner.ranks:
                raise ValueError(
                    f"learner.gpus={learner.gpus} lists {len(learner.gpus)} GPU(s) for learner.ranks={learner.ranks}: one per rank"
                )
        if actor.gpus == "share":
            if learner.ranks != 1:
                raise ValueError(
                    f'actor.gpus="share" puts the actors on the learner\'s one GPU, but learner.ranks={learner.ranks}'
                )
            if actor.tensor_parallel_size != 1:
                raise ValueError(
                    f'actor.gpus="share" gives each actor one GPU; actor.tensor_parallel_size={actor.tensor_parallel_size}'
                )
        if actor.gpus is not None:
            # a placed actor sees only its own GPUs, numbered from 0
            group = 1 if actor.gpus == "share" else actor.tensor_parallel_size
            kind, _, index = actor.device.partition(":")
            if kind == "cuda" and index.isdigit() and int(index) >= group:
                raise ValueError(
                    f"actor.device={actor.device} with actor.gpus={actor.gpus}: each actor sees only "
                    f"its own {group} GPU(s) as cuda:0..{group - 1}"
                )
        if isinstance(actor.gpus, list):
            check_indices("actor.gpus", actor.gpus)
            if len(actor.gpus) % actor.tensor_parallel_size:
                raise ValueError(
                    f"actor.gpus={actor.gpus}: its length must be a multiple of actor.tensor_parallel_size={actor.tensor_parallel_size}"
                )
            # whether they overlap the learner's GPUs is the launcher's to check: on an actors
            # host (`streamrl actors`) the learner is elsewhere (launch.placement.check)
        return self

    @property
    def rollout_source(self) -> str:
        """What the actors roll out (``actors.sources``): agents' calls, an environment's
        trajectories, or dataset prompts' completions."""
        if self.agent.enabled:
            return "agent"
        return "environment" if self.env.name else "prompts"

    @property
    def reward_ranges(self) -> dict[str, tuple[float, float]]:
        """Measure -> the range its values lie in: each reward function's parts (by part name),
        the bonus part of an environment (``env``) or of agents (``agent``), and the total
        (``reward``: the weighted sum of the functions' ranges and the bonus's). A config that
        names no reward (a learner fed by actors configured elsewhere) bounds the total by
        ``broker.max_abs_reward``."""
        fallback = (-self.broker.max_abs_reward, self.broker.max_abs_reward)
        if not self.reward.functions and not self.env.name and not self.agent.enabled:
            return {"reward": fallback}
        ranges, low, high = {}, 0.0, 0.0
        for spec in self.reward.functions:
            lo, hi = spec.range or BUILTIN_REWARD_RANGES.get(spec.fn, fallback)
            ranges[spec.name or spec.fn] = (lo, hi)
            # 0 too: a function that failed, or was not called (an agent's own reward), adds 0
            low += min(0.0, spec.weight * lo, spec.weight * hi)
            high += max(0.0, spec.weight * lo, spec.weight * hi)
        bonus = {}
        if self.env.name:
            bonus["env"] = fallback
        if self.agent.enabled:
            bonus["agent"] = tuple(self.agent.reward_range)
        for name, (lo, hi) in bonus.items():
            ranges[name] = (lo, hi)
            low, high = low + min(0.0, lo), high + max(0.0, hi)
        if self.env.name and self.env.truncated_reward is not None:
            low = min(low, self.env.truncated_reward)
            high = max(high, self.env.truncated_reward)
        return ranges | {"reward": (low, high)}

    @property
    def completion_limit(self) -> tuple[str, int]:
        """The knob that bounds one completion, and its value: a trajectory's tokens after its
        prompt for an environment or agents, else the tokens one completion may sample."""
        if self.agent.enabled:
            return "agent.max_total_tokens", self.agent.max_total_tokens
        if self.env.name is not None:
            return "env.max_total_tokens", self.env.max_total_tokens
        return "rollout.max_new_tokens", self.rollout.max_new_tokens

    def sections_for(self, build) -> dict[str, Section]:
        """The sections a registry's ``from_config`` names as keyword-only parameters, by name:
        a source or an engine gets exactly the settings it reads."""
        params = inspect.signature(build).parameters.values()
        return {p.name: getattr(self, p.name) for p in params if p.kind is p.KEYWORD_ONLY}

    @model_validator(mode="after")
    def _device_ipc_actors(self) -> Config:
        ws, actor = self.weightsync, self.actor
        if ws.transport not in DEVICE_IPC_TRANSPORTS:
            return self
        why = f"weightsync.transport={ws.transport} copies weights from the learner's GPU into GPU actors on its host"
        if ws.relay:
            raise ValueError(
                f"weightsync.relay=true: relays serve actors on other hosts over shm, but {why}; use weightsync.transport=dist with relays"
            )
        on_device = [e for e in sorted(actor.engines_in_use) if ENGINE_PLACEMENT[e] == "device"]
        if on_device and not actor.device.startswith("cuda"):
            raise ValueError(
                f"actor.device={actor.device} for the {', '.join(on_device)} engine: {why}; use weightsync.transport=shm for CPU actors"
            )
        return self

    @model_validator(mode="after")
    def _lr_horizon(self) -> Config:
        scheduler = self.learner.lr_scheduler
        if scheduler in ("linear", "cosine") and self.run.max_steps == 0:
            raise ValueError(
                f"learner.lr_scheduler={scheduler} decays the LR to 0 at run.max_steps, which is 0 "
                "(no limit): set run.max_steps, or learner.lr_scheduler=constant"
            )
        return self

    @model_validator(mode="after")
    def _one_rollout_source(self) -> Config:
        if self.agent.enabled and self.env.name:
            raise ValueError(
                f"agent.enabled and env.name={self.env.name!r}: an actor either serves agents or runs an environment, not both"
            )
        return self

    @model_validator(mode="after")
    def _target_parts_are_reward_parts(self) -> Config:
        fns = [spec.name or spec.fn for spec in self.reward.functions]
        unknown = [
            part
            for part in self.run.target_parts
            if not any(part == fn or part.startswith(fn + "/") for fn in fns)
        ]
        if unknown:
            raise ValueError(
                f"run.target_parts names {unknown}, not a reward part of this task: parts are named "
                f"after reward.functions ({fns}) as `fn` (or its `name`), or `fn/key` for a function returning a dict"
            )
        return self
