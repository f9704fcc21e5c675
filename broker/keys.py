"""Every Redis key of a run, built in one place (docs/architecture.md, "Redis keys").

All keys live under ``streamrl:{run_name}:`` so several runs can share one Redis.
"""

from __future__ import annotations

import re

from streamrl.configs.schema import BrokerConfig, RunConfig

_RUN_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


class Keys:
    """Key names of one run. Attributes are plain ``str`` keys; ``actor(id)`` builds per-actor keys."""

    def __init__(self, run_name: str, stream: str = "rollouts", dead_letter: str = "rollouts:dead"):
        if not _RUN_NAME.match(run_name):
            raise ValueError(
                f"run name {run_name!r}: use letters, digits, '_', '-', '.' only (it becomes a Redis key prefix)"
            )
        self.run_name = run_name
        self.prefix = f"streamrl:{run_name}:"
        p = self.prefix
        self.stream = p + stream
        self.dead = p + dead_letter
        self.version = p + "version"
        self.accepted = p + "adm:accepted"
        self.consumed = p + "adm:consumed"
        self.discarded = p + "adm:discarded"
        self.trimmed = p + "adm:trimmed"
        self.leases = p + "adm:leases"
        # the admission bound the learner sets under algo.max_staleness: auto
        self.bound = p + "adm:max_staleness"
        # a random id of Redis's data set: a new one after Redis lost its data (admission.epoch)
        self.epoch = p + "adm:epoch"
        self.trained = p + "trained"
        # group id -> content digest of the group trained under it (broker.stream: a different
        # group reusing a trained id is told apart and trained under a qualified id)
        self.trained_digests = p + "trained:digests"
        self.actors = p + "actors"
        self.prompts_cursor = p + "prompts:cursor"
        self.weights = p + "weights"
        self.weights_notify = p + "weights:notify"
        # dist transport rendezvous
        self.weights_dist_members = p + "weights:dist:members"
        self.weights_dist_group = p + "weights:dist:group"
        self.weights_dist_epoch = p + "weights:dist:group:epoch"
        # the id of the learner nodes' torchrun rendezvous: random, so its keys are not guessable
        self.learner_rdzv = p + "learner:rdzv"
        self.metrics_targets = p + "metrics:targets"
        # the same fields -> the run.host_id of the process serving them (a scrape target label)
        self.metrics_hosts = p + "metrics:hosts"
        # `make scale` -> the supervisor of `make run`
        self.launch_control = p + "launch:control"

    @classmethod
    def from_config(cls, run: RunConfig, broker: BrokerConfig) -> Keys:
        return cls(run.name, broker.stream, broker.dead_letter_stream)

    def eval_claim(self, version: int) -> str:
        """Set (NX) by the one actor that evaluates this policy version."""
        return f"{self.prefix}eval:{version}"

    def weights_dist_secret(self, epoch: int) -> str:
        """The dist transport's HMAC secret of one group epoch (weightsync.transports.dist.trust)."""
        return f"{self.prefix}weights:dist:secret:{epoch}"

    def actor(self, actor_id: str) -> str:
        """Heartbeat hash of one actor."""
        return f"{self.prefix}actor:{actor_id}"

    def __repr__(self) -> str:
        return f"Keys({self.run_name!r})"
