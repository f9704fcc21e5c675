"""Experiment tracking of the learner's step rows: TensorBoard by default, W&B and trackio optional.

``run.report_to`` picks the backends. Every numeric value of the step row is logged as a
scalar at its step (nested dicts flattened with ``/``: ``reward_parts/<part>``,
``groups_by_actor/<actor>``), and every ``run.log_samples_every`` steps a table of
``run.log_samples`` sample completions (prompt, completion, reward, advantage). TensorBoard
event files go to ``<run.dir>/tensorboard`` (``make tensorboard`` serves them); W&B and
trackio take their usual settings from the environment (``WANDB_MODE``, ``WANDB_PROJECT``...)
and are extras: ``pip install 'streamrl[wandb]'`` / ``'streamrl[trackio]'``.

A learner restart (a crash, a resumed run) continues the same W&B and trackio run: the W&B
run id and the trackio run name are drawn once and kept in ``<run.dir>/tracker.json``, and
both are initialised with ``resume="allow"``. The configuration they record is the redacted
one (``configs.redact``): no Redis password, API key or URL credential reaches a tracker.
"""

from __future__ import annotations

import json
import math
import os
import sys
import uuid
from pathlib import Path

from streamrl.configs.errors import ConfigError
from streamrl.configs.runfiles import write_new
from streamrl.configs.schema import RunConfig

TENSORBOARD_DIR = "tensorboard"
IDS_FILE = "tracker.json"


def run_ids(run_dir: str | os.PathLike, name: str) -> dict[str, str]:
    """The tracker run ids of the run in ``run_dir``: drawn on the first call, the same ever after."""
    path = Path(run_dir) / IDS_FILE
    if path.exists():
        return json.loads(path.read_text())
    # W&B ids: lowercase letters and digits; the trackio name reads as the run's
    ids = {"wandb_id": uuid.uuid4().hex[:12], "trackio_name": f"{name}-{uuid.uuid4().hex[:6]}"}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_new(path, json.dumps(ids) + "\n")
    return ids


def scalars(row: dict, prefix: str = "") -> dict[str, float]:
    """The finite numbers of a step row, nested dicts flattened to ``parent/key``."""
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(scalars(value, f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value) and key not in ("step", "time"):
                out[name] = float(value)
    return out


def sample_rows(samples, tokenizer, count: int) -> list[dict]:
    """The first ``count`` samples of a batch, decoded."""
    rows = []
    for s in samples[:count]:
        ids = s.input_ids.tolist()
        rows.append(
            {
                "prompt": tokenizer.decode(ids[: s.prompt_len], skip_special_tokens=False),
                "completion": tokenizer.decode(ids[s.prompt_len :], skip_special_tokens=False),
                "reward": s.reward,
                "advantage": s.advantage,
            }
        )
    return rows


def _markdown(rows: list[dict]) -> str:
    def cell(value) -> str:
        text = f"{value:.4f}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", "⏎")

    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(r[k]) for k in head) + " |" for r in rows]
    return "\n".join(lines)


class Tracker:
    """Rank 0's tracking backends; ``log`` once per step row.

    ``tokenizer_path`` decodes the sample tables (``model.path``); ``hyperparameters`` is the run's
    whole configuration as W&B and trackio record it (``configs.redact.redacted(cfg)``)."""

    def __init__(self, run: RunConfig, tokenizer_path: str, hyperparameters: dict):
        self.run = run
        self.tokenizer_path = tokenizer_path
        self.backends = list(run.report_to)
        self._tokenizer = None
        self.tb = self.wandb = self.trackio = None
        if "tensorboard" in self.backends:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(Path(run.dir) / TENSORBOARD_DIR))
        if "wandb" in self.backends or "trackio" in self.backends:
            ids = run_ids(run.dir, run.name)
        if "wandb" in self.backends:
            self.wandb = _import("wandb")
            self.wandb_run = self.wandb.init(
                name=run.name,
                dir=run.dir,
                config=hyperparameters,
                id=ids["wandb_id"],
                resume="allow",
            )
        if "trackio" in self.backends:
            self.trackio = _import("trackio")
            self.trackio.init(
                project=run.name, name=ids["trackio_name"], config=hyperparameters, resume="allow"
            )

    def tokenizer(self):
        if self._tokenizer is None:
            from streamrl.policy.load import load_tokenizer

            self._tokenizer = load_tokenizer(self.tokenizer_path)
        return self._tokenizer

    def log(self, row: dict, batch) -> None:
        step = int(row["step"])
        values = scalars(row)
        every = self.run.log_samples_every
        table = (
            sample_rows(batch.samples, self.tokenizer(), self.run.log_samples)
            if every and step % every == 0 and batch.samples
            else []
        )
        if self.tb is not None:
            for name, value in values.items():
                self.tb.add_scalar(name, value, step)
            if table:
                self.tb.add_text("samples", _markdown(table), step)
            self.tb.flush()
        if self.wandb is not None:
            payload: dict = dict(values)
            if table:
                columns = list(table[0])
                payload["samples"] = self.wandb.Table(
                    columns=columns, data=[[r[c] for c in columns] for r in table]
                )
            self.wandb_run.log(payload, step=step)
        if self.trackio is not None:
            self.trackio.log(values, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb_run.finish()
        if self.trackio is not None:
            self.trackio.finish()


def check_installed(run: RunConfig) -> None:
    """ConfigError, naming ``run.report_to``, when a tracker it names is not installed: every
    command that starts a learner checks it first, so a missing extra stops the run in one line
    before anything starts (not a learner that crash-loops on its import)."""
    import importlib.util

    missing = [
        name
        for name in run.report_to
        if name not in sys.modules and importlib.util.find_spec(name) is None
    ]
    if missing:
        raise ConfigError(
            f"run.report_to includes {', '.join(missing)}, which is not installed: pip install "
            f"'streamrl[{missing[0]}]', or leave it out of run.report_to"
        )


def _import(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise RuntimeError(
            f"run.report_to includes {name}, which is not installed: pip install 'streamrl[{name}]'"
        ) from None
