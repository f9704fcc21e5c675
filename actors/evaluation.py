"""Periodic evaluation on held-out prompts, run by one actor per policy version.

With ``data.eval_path`` and ``data.eval_every`` set, the first actor whose weights cross
a multiple of ``eval_every`` versions claims it (``SET NX`` on ``eval:<multiple>``, so
each is evaluated once across all actors) and generates one completion per
eval prompt twice: sampled at ``rollout.temperature`` (with its top-p/top-k) and greedy
(top-k 1). Both are scored by the actor's reward pool. The row (``version``, mean reward,
pass@1 = fraction of completions scoring the full reward, for both) is appended to
``<run.dir>/eval.jsonl`` and, with TensorBoard in ``run.report_to``, written to
``<run.dir>/tensorboard/eval`` at step = version.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from streamrl.actors.engines.base import Request
from streamrl.actors.prompt_data import PromptDataset
from streamrl.actors.rewards import RewardPool
from streamrl.runtime.jsonl_log import JsonlLog

if TYPE_CHECKING:
    from streamrl.actors.sources.base import Generation

log = logging.getLogger(__name__)

PASS_TOLERANCE = 1e-6
EVAL_LOG = "eval.jsonl"


class EvalClaims:
    """Which actor evaluates a version: the first to ``SET NX`` ``eval:<version>``."""

    def __init__(self, redis_client, keys, actor_id: str) -> None:
        self.redis = redis_client
        self.keys = keys
        self.actor_id = actor_id

    async def claim(self, version: int) -> bool:
        return bool(await self.redis.set(self.keys.eval_claim(version), self.actor_id, nx=True))


def summarize(totals: list[float]) -> tuple[float, float]:
    """(mean reward, pass@1): pass = the sample reached a total reward of 1."""
    values = np.asarray(totals, dtype=np.float64)
    return float(values.mean()), float((values >= 1.0 - PASS_TOLERANCE).mean())


class Evaluator:
    def __init__(
        self,
        dataset: PromptDataset,
        *,
        size: int,
        every: int,
        run_dir: str,
        tensorboard: bool,
        gen: Generation,
        rewards: RewardPool,
        claims: EvalClaims | None,
        should_abort: Callable[[], bool] | None = None,
    ):
        """The first ``size`` prompts of ``dataset`` (``data.eval_*``), every ``every`` versions;
        rows to <run_dir>/eval.jsonl, and to TensorBoard with ``tensorboard``."""
        self.prompts = [dataset.get(i) for i in range(min(len(dataset), size))]
        self.every = every
        self.gen = gen
        self.rewards = rewards
        self.claims = claims
        self.should_abort = should_abort
        self.sampled = gen.params
        self.greedy = dataclasses.replace(gen.params, top_k=1, top_p=1.0)
        # the engine version of the last evaluation this actor considered
        self.evaluated = 0
        self.log = JsonlLog(Path(run_dir) / EVAL_LOG)
        self.tb = None
        if tensorboard:
            # slow to import (tensorboard and its protobufs): only a run that reports to it pays
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard" / "eval"))

    async def maybe_run(self) -> None:
        """Evaluate once per ``eval_every`` versions crossed, if this actor claims that version."""
        version = self.gen.engine.version
        if version // self.every <= self.evaluated // self.every:
            return
        self.evaluated = version
        if not await self.claims.claim(version // self.every * self.every):
            return
        row = await asyncio.to_thread(self.run, version)
        log.info("eval at version %d: %s", version, row)

    def run(self, version: int) -> dict:
        """Generate, score and log one evaluation of the engine's current weights (blocking)."""
        engine, rewards = self.gen.engine, self.rewards
        row: dict = {"version": version, "prompts": len(self.prompts)}
        for name, params in (("sampled", self.sampled), ("greedy", self.greedy)):
            requests = [Request(f"eval:{i}", p.token_ids) for i, p in enumerate(self.prompts)]
            outputs = engine.generate(requests, params, self.should_abort)
            inputs = [
                self.gen.reward_input(p, o) for p, o in zip(self.prompts, outputs, strict=True)
            ]
            mean, passed = summarize([s.total for s in rewards.score(inputs)])
            row[f"{name}/reward_mean"] = mean
            row[f"{name}/pass@1"] = passed
        row["time"] = time.time()
        self.log.write(row)
        if self.tb is not None:
            for key, value in row.items():
                if key not in ("version", "time", "prompts"):
                    self.tb.add_scalar(f"eval/{key}", value, version)
            self.tb.flush()
        return row

    def close(self) -> None:
        self.log.close()
        if self.tb is not None:
            self.tb.close()
