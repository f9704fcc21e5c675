"""The run itself (``run``) and the Prometheus endpoints of its processes (``metrics``)."""

from __future__ import annotations

import socket
from typing import Literal

from pydantic import Field, field_validator, model_validator

from streamrl.configs.section import Section


class RunConfig(Section):
    """One run: its name, directory, seed and end."""

    name: str = Field(
        "streamrl",
        description="Run name; also the Redis key prefix, so several runs can share one Redis.",
    )
    dir: str | None = Field(
        None,
        description="Run directory: logs, checkpoints, scrape config, the Redis data dir. None = `runs/<run.name>`.",
    )
    seed: int = Field(0, description="Seed for prompt order, sampling and initialisation.")
    max_steps: int = Field(
        0, ge=0, description="Stop after this many learner steps (0 = no limit)."
    )
    max_time_s: float = Field(
        0.0, ge=0, description="Stop after this many seconds of wall time (0 = no limit)."
    )
    torch_threads: int = Field(
        1,
        ge=1,
        description="torch threads per process; 2 threads on 2 shared cores ran 35x slower.",
    )
    target_reward: float = Field(
        0.0,
        ge=0,
        description="Stop once the mean reward of the last `target_window` learner steps reaches this (0 = no reward bar).",
    )
    target_parts: dict[str, float] = Field(
        default_factory=dict,
        description="Stop once the means of these reward parts over the last `target_window` steps reach their bars, e.g. `{reverse_digits_exact: 0.85}`; a part is named after its reward function (its `name`, else `fn`; `fn/key` for a function returning a dict). Every bar set, `target_reward` included, must hold; a bar of 0 is no bar.",
    )
    target_window: int = Field(
        20,
        ge=1,
        description="Learner steps averaged for the target (the reference loop's 20-rollout mean).",
    )
    report_to: list[Literal["tensorboard", "wandb", "trackio"]] = Field(
        default_factory=lambda: ["tensorboard"],
        description="Experiment trackers that get every scalar of the learner's step rows (TensorBoard event files under <run.dir>/tensorboard; wandb and trackio are extras).",
    )
    log_samples_every: int = Field(
        10, ge=0, description="Log a table of sample completions every N learner steps (0 = off)."
    )
    log_samples: int = Field(4, ge=1, description="Sample completions per logged table.")
    shared_read: bool = Field(
        False,
        description="Let other local users read what the run writes (logs, step rows, checkpoints, TensorBoard files, the run directory): new files 0644 and directories 0755 instead of 0600/0700. Never writable by others.",
    )
    export_at_end: bool = Field(
        True,
        description="When the learner stops, write the policy as a Hugging Face folder (safetensors, config, tokenizer) to <run.dir>/policy.",
    )
    host_id: str = Field(
        "",
        pattern=r"^[A-Za-z0-9_.\-]*$",
        validate_default=True,
        # a property of the process, not of the run: a saved run config read on another host
        # must not make that host pose as this one
        exclude=True,
        description="This host's identity; '' = its hostname. Everything host-local is keyed by it: the weight announcements and shared-memory segment its actors read, run-dir files, the metrics' host label. Every host of a run needs a distinct one. Never saved with the run's config.",
    )

    @field_validator("name")
    @classmethod
    def _name_is_one_path_part(cls, name: str) -> str:
        # the default run.dir is runs/<name>: `..` would make it the working directory
        if name in ("", ".", "..") or "/" in name or "\\" in name:
            raise ValueError("must be a plain name: not empty, `.`, `..` or a path with / or \\")
        return name

    @field_validator("host_id")
    @classmethod
    def _hostname(cls, value: str) -> str:
        # one path part below run.dir (hosts/<host_id>)
        if value in (".", ".."):
            raise ValueError(f"{value!r} names a directory, not a host")
        return value or socket.gethostname()

    @model_validator(mode="before")
    @classmethod
    def _dir_from_name(cls, data):
        # before validation, so the derived directory is a set value like any other
        if isinstance(data, dict) and data.get("dir") is None:
            name = data.get("name", cls.model_fields["name"].default)
            data = {**data, "dir": f"runs/{name}"}
        return data


class MetricsConfig(Section):
    """Prometheus endpoints of every process."""

    host: str = Field(
        "127.0.0.1",
        description="Bind address of every metrics endpoint (loopback unless you expose it on purpose).",
    )
    enabled: bool = Field(True, description="Serve Prometheus metrics from every process.")
