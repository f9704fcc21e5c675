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

import dataclasses
import time
from pathlib import Path

import numpy as np

from streamrl.actors.engines.base import Request, SamplingParams
from streamrl.actors.prompts import PromptDataset
from streamrl.actors.rewards import RewardInput, RewardPool
from streamrl.broker.audit import JsonlLog
from streamrl.configs.schema import DataConfig, RunConfig

PASS_TOLERANCE = 1e-6
EVAL_LOG = "eval.jsonl"


def eval_dataset(data_cfg: DataConfig, tokenizer) -> PromptDataset:
    return PromptDataset(
        data_cfg.eval_path,
        tokenizer,
        data_cfg.format,
        data_cfg.eval_split or data_cfg.split,
        data_cfg.apply_chat_template,
        data_cfg.prompt_key,
        data_cfg.answer_key,
        data_cfg.config,
    )


def summarize(totals: list[float]) -> tuple[float, float]:
    """(mean reward, pass@1): pass = the sample reached a total reward of 1."""
    values = np.asarray(totals, dtype=np.float64)
    return float(values.mean()), float((values >= 1.0 - PASS_TOLERANCE).mean())


class Evaluator:
    def __init__(
        self, data_cfg: DataConfig, run_cfg: RunConfig, tokenizer, params: SamplingParams, decode
    ):
        dataset = eval_dataset(data_cfg, tokenizer)
        self.prompts = [dataset.get(i) for i in range(min(len(dataset), data_cfg.eval_size))]
        self.conversational = dataset.format == "messages"
        self.sampled = params
        self.greedy = dataclasses.replace(params, top_k=1, top_p=1.0)
        self.decode = decode
        self.log = JsonlLog(Path(run_cfg.dir) / EVAL_LOG)
        self.tb = None
        if "tensorboard" in run_cfg.report_to:
            # slow to import (tensorboard and its protobufs): only a run that reports to it pays
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(Path(run_cfg.dir) / "tensorboard" / "eval"))

    def run(self, engine, rewards: RewardPool, version: int, should_abort=None) -> dict:
        """Generate, score and log one evaluation of the engine's current weights (blocking)."""
        row: dict = {"version": version, "prompts": len(self.prompts)}
        for name, params in (("sampled", self.sampled), ("greedy", self.greedy)):
            requests = [Request(f"eval:{i}", p.token_ids) for i, p in enumerate(self.prompts)]
            outputs = engine.generate(requests, params, should_abort)
            inputs = [
                RewardInput(
                    p.messages + [self.decode(o)],
                    p.answer,
                    p.columns,
                    self.conversational,
                    o.token_ids.tolist(),
                )
                for p, o in zip(self.prompts, outputs, strict=True)
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
