"""Actor processes and their generation engine (``actor``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from streamrl.configs.section import Section

# Where each engine (``actor.engine``) computes: "device" = on ``actor.device``; "gpu" = on the
# host's GPU when it has one, else on the CPU (vLLM, whose CPU build runs there). The learner
# publishes in the dtype the engines compute in (``weightsync.publisher.transfer_dtype``); the
# engines themselves are ``actors.engines``' registry, which tests/test_structure.py holds to this.
ENGINE_PLACEMENT = {"hf": "device", "vllm": "gpu"}


class ActorConfig(Section):
    """Actor processes and their generation engine."""

    engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="Generation engine: hf (transformers, any device) or vllm (vLLM on GPUs, or its CPU build: make .venv-vllm).",
    )
    engines: list[Literal["hf", "vllm"]] | None = Field(
        None,
        min_length=1,
        description="Per-actor engines of a supervised run (`make run`): actor i runs engines[i % len], passed to it as `actor.engine`; e.g. [vllm, hf] mixes the two. None = every actor runs `engine`. With vllm in it the whole run needs the vLLM venv.",
    )
    device: str = Field("cpu", description="torch device of the hf engine.")
    cuda_graphs: Literal["auto", "on", "off"] = Field(
        "auto",
        description="hf engine decode on CUDA: on = a static KV cache per slot and each decode step replayed as a CUDA graph captured per batch-size bucket (powers of two up to batch_slots), weights copied into the parameters in place; off = the dynamic cache (each step launched from Python); auto = on when actor.device is CUDA, off on CPU. on with a CPU actor.device is refused.",
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
    gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="vLLM: fraction of GPU memory for weights and KV cache."
    )
    tensor_parallel_size: int = Field(
        1, ge=1, description="vLLM: tensor parallel degree of one actor."
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
        description='GPUs of the supervised actors (of `streamrl run`, and of `streamrl actors` on each actors host), as indices into the devices the launcher sees (its CUDA_VISIBLE_DEVICES, else all): actor i gets the (i mod n)-th group of `tensor_parallel_size` indices as its CUDA_VISIBLE_DEVICES, so more actors than GPUs share them round-robin (each vLLM actor then takes `gpu_memory_utilization` of its GPU). "share" = every actor on the learner\'s one GPU (`learner.gpus` of length 1, else GPU 0), beside it. None = no placement: children inherit CUDA_VISIBLE_DEVICES.',
    )
    staggered_start: bool = Field(
        False,
        description="`make run` starts the first actor with the learner and each further one once the one before it has sent its first heartbeat, instead of all at once. Start-up is CPU-bound (imports, model loading): on 2 cores the demo's first trained step came 6.8 s after the launch this way, 9.5 s with the learner and both actors starting at once (medians of 5, docs/benchmarks.md \"Start-up\"). An actor started later runs its start-up on its `actor.cpus`, off the learner's cores. On a host with a core per process it only delays the later actors.",
    )
    cpus: list[int] | Literal["auto"] | None = Field(
        None,
        description='CPU cores the supervised actors run on once each has started (start-up uses every core), as indices into the cores the launcher may use (its affinity: `taskset`, a cgroup cpuset); every actor gets the whole list, its threads and child processes (reward workers) included. "auto" = the launcher\'s cores that `learner.cpus` "auto" does not take, for hf actors only (vLLM places its own threads), and only when the learner gets cores of its own. None = no pinning.',
    )

    @field_validator("cuda_graphs", mode="before")
    @classmethod
    def _yaml_on_off(cls, value):
        # YAML reads a bare on / off as a boolean
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _graphs_need_cuda(self) -> ActorConfig:
        if self.cuda_graphs == "on" and not self.device.startswith("cuda"):
            raise ValueError(
                f"actor.cuda_graphs=on needs a CUDA actor.device (CUDA graphs), not {self.device!r}: use auto or off"
            )
        return self

    def engine_of(self, index: int) -> str:
        """The engine of the supervised actor with this index (a0, a1, ...)."""
        return self.engines[index % len(self.engines)] if self.engines else self.engine

    @property
    def engines_in_use(self) -> set[str]:
        """Every engine some actor of the run computes with."""
        return set(self.engines) if self.engines else {self.engine}
