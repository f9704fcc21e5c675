"""Actor processes and their generation engine (``actor``).

What every engine shares is declared here; each engine's own settings are its ``options`` class in
its own module (``actors.engines.<name>``), which becomes the section ``actor.<name>`` of the
registry's every engine. So an engine is one module plus its entry in the registry, and nothing
here names one.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, create_model, model_validator

from streamrl.actors.engines import ENGINES
from streamrl.configs.section import Section, backend_sections, unread_options_kept

EngineName = Literal[tuple(ENGINES)]  # type: ignore[valid-type]


class _Shared(Section):
    """Actor processes and their generation engine."""

    engine: EngineName = Field(
        "hf",
        description="Generation engine: "
        + " or ".join(e.summary for e in ENGINES.values())
        + ". Its own settings are the section of its name below.",
    )
    engines: list[EngineName] | None = Field(
        None,
        min_length=1,
        description="Per-actor engines of a supervised run (`make run`): actor i runs engines[i % len], passed to it as `actor.engine`; e.g. [vllm, hf] mixes the two. None = every actor runs `engine`. With vllm in it the whole run needs the vLLM venv.",
    )
    device: str = Field(
        "cpu",
        description="torch device of the engines that compute on it (hf), and where an actor stages the versions it receives for its engine.",
    )
    batch_slots: int = Field(
        64,
        ge=1,
        description="Concurrent sequences of one actor's engine: the hf engine's decode batch, vLLM's max_num_seqs.",
    )
    refill: bool = Field(
        True,
        description="Keep the engine's batch full across groups (source `prompts`): once a group's worth of slots is free, the next admitted groups take them, so no slot waits for a batch's longest completion (real completions' lengths are long-tailed). False: a batch of batch_slots / group_size groups is generated before the next is admitted. Either way each group is published as soon as its completions are done. Where every completion has the same few tokens it buys nothing: on the CPU demo (4 tokens) learner steps took 1.02-1.06x as long with it (3 seeds, 2026-11-28).",
    )
    heartbeat_s: float = Field(
        2.0, gt=0, description="Heartbeat period; an actor is considered dead after 3 missed beats."
    )
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Prometheus port of the first actor (0 = free port); later actors use free ports.",
    )
    max_actors: int = Field(
        64,
        ge=0,
        description="Most supervised actors a scale command (launch:control in Redis, make scale) may ask for; larger requests are clamped to it and logged.",
    )
    publish_log: bool = Field(
        False,
        description="Append every published group id and its stream entry id to <run.dir>/published/<actor id>.jsonl (audit; the chaos harness checks delivery against it).",
    )
    gpus: list[int] | Literal["share"] | None = Field(
        None,
        description='GPUs of the supervised actors (of `streamrl run`, and of `streamrl actors` on each actors host), as indices into the devices the launcher sees (its CUDA_VISIBLE_DEVICES, else all): actor i gets the (i mod n)-th group of the GPUs one actor takes (`actor.vllm.tensor_parallel_size` for vLLM, else 1) as its CUDA_VISIBLE_DEVICES, so more actors than GPUs share them round-robin (each vLLM actor then takes `actor.vllm.gpu_memory_utilization` of its GPU). "share" = every actor on the learner\'s one GPU (`learner.gpus` of length 1, else GPU 0), beside it. None = no placement: children inherit CUDA_VISIBLE_DEVICES.',
    )
    staggered_start: bool = Field(
        False,
        description="`make run` starts the first actor with the learner and each further one once the one before it has sent its first heartbeat, instead of all at once. Start-up is CPU-bound (imports, model loading): on 2 cores the demo's first trained step came 6.8 s after the launch this way, 9.5 s with the learner and both actors starting at once (medians of 5, docs/benchmarks.md \"Start-up\"). An actor started later runs its start-up on its `actor.cpus`, off the learner's cores. On a host with a core per process it only delays the later actors.",
    )
    cpus: list[int] | Literal["auto"] | None = Field(
        None,
        description='CPU cores the supervised actors run on once each has started (start-up uses every core), as indices into the cores the launcher may use (its affinity: `taskset`, a cgroup cpuset); every actor gets the whole list, its threads and child processes (reward workers) included. "auto" = the launcher\'s cores that `learner.cpus` "auto" does not take, for hf actors only (vLLM places its own threads), and only when the learner gets cores of its own. None = no pinning.',
    )

    @model_validator(mode="after")
    def _engines_fit(self) -> _Shared:
        in_use = self.engines_in_use
        unread_options_kept(
            self, "actor", [name for name in ENGINES if name not in in_use],
            f"no actor runs that engine (actor.engine={self.engine}, actor.engines={self.engines})",
        )  # fmt: skip
        for name in sorted(in_use):
            ENGINES[name].check(self)
        return self

    def engine_of(self, index: int) -> str:
        """The engine of the supervised actor with this index (a0, a1, ...)."""
        return self.engines[index % len(self.engines)] if self.engines else self.engine

    @property
    def engines_in_use(self) -> set[str]:
        """Every engine some actor of the run computes with."""
        return set(self.engines) if self.engines else {self.engine}

    @property
    def computes_on(self) -> set[str]:
        """Where the engines in use compute (``EngineSpec.computes_on``: "device", "gpu")."""
        return {ENGINES[e].computes_on for e in self.engines_in_use}

    def engines_computing_on(self, where: str) -> list[str]:
        """The engines in use that compute ``where`` (``EngineSpec.computes_on``: "device" or
        "gpu")."""
        return [e for e in sorted(self.engines_in_use) if ENGINES[e].computes_on == where]

    @property
    def gpus_per_actor(self) -> int:
        """The GPUs one supervised actor takes: the most any engine in use needs (``actor.gpus``
        hands them out in groups of this many)."""
        return max(ENGINES[e].gpus_per_actor(getattr(self, e, None)) for e in self.engines_in_use)


ActorConfig = create_model(
    "ActorConfig",
    __base__=_Shared,
    __doc__=_Shared.__doc__,
    __module__=__name__,
    **backend_sections(
        {name: e.options for name, e in ENGINES.items()},
        "The {name} engine's own settings, read while an actor runs it.",
    ),
)
