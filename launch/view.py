"""What the terminal shows while a run is going, and the summary printed at its end."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from streamrl.broker import env_stats
from streamrl.launch import placement as gpus
from streamrl.launch.status import Snapshot, describe_hosts, time_to_target
from streamrl.learner import target

# without a terminal, a line per this many learner steps when the run has no max_steps
PLAIN_EVERY_STEPS = 10
# and at most this many lines over a run with one
PLAIN_LINES = 20


def eta_s(step: int, elapsed_s: float, rate: float | None, max_steps: int, max_time_s: float):
    """Seconds until the run stops at ``max_steps`` or ``max_time_s``, whichever comes first
    (0 = no such limit) at ``rate`` steps/s (the observed one). With max_steps: 0 once it is
    reached, None until there is a rate (a guess from max_time_s alone would read as the run's
    end); without it, the time left of max_time_s; None when neither limit is set."""
    time_left = max(max_time_s - elapsed_s, 0.0) if max_time_s else None
    if not max_steps:
        return time_left
    if step >= max_steps:
        return 0.0
    if not rate:
        return None
    steps_left = (max_steps - step) / rate
    return steps_left if time_left is None else min(steps_left, time_left)


def plain_every(max_steps: int) -> int:
    """Learner steps between two plain lines: about ``PLAIN_LINES`` over a run of max_steps."""
    return max(1, -(-max_steps // PLAIN_LINES)) if max_steps else PLAIN_EVERY_STEPS


def plain_due(step: int, last: int | None, every: int) -> bool:
    """Whether learner step ``step`` gets a plain line, the last one having gone at ``last``:
    the first step, then each step that enters a new block of ``every``."""
    return step > 0 and (last is None or step // every > last // every)


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class RunProgress:
    """Step N / max_steps as a rich.progress bar (a bar over ``max_time_s`` when the run has no
    max_steps) with the ETA of ``eta_s``; the step rate is measured from the first step this
    view saw, so start-up and a resumed run's earlier steps do not skew it."""

    def __init__(self, max_steps: int, max_time_s: float) -> None:
        self.max_steps, self.max_time_s = max_steps, max_time_s
        self.first: tuple[int, float] | None = None
        self.step, self.eta = 0, None
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn(
                "{task.percentage:>3.0f}%  elapsed {task.fields[elapsed]}  ETA {task.fields[eta]}"
            ),
        )
        total = max_steps or max_time_s or None
        self.task = self.bar.add_task("", total=total, elapsed=_clock(0), eta=_clock(None))

    def rate(self, step: int, elapsed_s: float) -> float | None:
        if self.first is None or step <= self.first[0] or elapsed_s <= self.first[1]:
            return None
        return (step - self.first[0]) / (elapsed_s - self.first[1])

    def update(self, step: int | None, elapsed_s: float) -> None:
        step = step or 0
        if step and self.first is None:
            self.first = (step, elapsed_s)
        self.step = step
        self.eta = eta_s(
            step, elapsed_s, self.rate(step, elapsed_s), self.max_steps, self.max_time_s
        )
        of = f"/{self.max_steps}" if self.max_steps else ""
        self.bar.update(
            self.task,
            completed=step if self.max_steps else min(elapsed_s, self.max_time_s),
            description=f"step {step}{of}",
            elapsed=_clock(elapsed_s),
            eta=_clock(self.eta),
        )

    def text(self) -> str:
        """The bar's words for a plain line: ``step 40/200 ETA 0:02:10``."""
        of = f"/{self.max_steps}" if self.max_steps else ""
        return f"step {self.step}{of} ETA {_clock(self.eta)}"


def _nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _off_policy_line(step: dict) -> str:
    """The step's drift figures: the IS weights' ESS, KL(mu || pi_prox), the share at the IS cap and
    the share of tokens masked as stale."""
    return (
        f"ESS {_fmt(step.get('is_ess'), '.3f')}  KL(mu||pi_prox) "
        f"{_fmt(step.get('behaviour_kl'), '.2e')}  capped "
        f"{_fmt(step.get('is_truncated_fraction'), '.1%')}  stale "
        f"{_fmt(step.get('stale_token_fraction'), '.1%')}"
    )


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None or _nan(value) else format(value, spec)


def _failed(rate: float) -> str:
    """A reward function's failure rate; past half it is what stops the run, so it stands out."""
    text = f"{rate:.0%}"
    return f"[bold red]{text}[/bold red]" if rate > 0.5 else text


class StepBar:
    """The console of a trainer in this process (``streamrl sft`` / ``dpo``): each step's line with
    the run's bar (``RunProgress``, ETA at the observed rate) under them on a terminal; elsewhere
    each line led by the bar's words, ``[   12s] step 3/40 ETA 0:01:10``. Made before the trainer
    (elapsed counts from here), told each step with the trainer's step count once it has one."""

    def __init__(self, max_time_s: float, console: Console | None = None) -> None:
        self.max_time_s = max_time_s
        self.console = console or Console()
        self.started = time.monotonic()
        self.progress: RunProgress | None = None
        self.live: Live | None = None

    def step(self, line: str, step: int, total: int) -> None:
        elapsed = time.monotonic() - self.started
        if self.progress is None:
            self.progress = RunProgress(total, self.max_time_s)
            if self.console.is_terminal:
                self.live = Live(self.progress.bar, console=self.console, refresh_per_second=2)
                self.live.start()
        self.progress.update(step, elapsed)
        if self.live is not None:
            self.console.print(line)
        else:
            print(f"[{elapsed:6.0f}s] {self.progress.text()}  {line}", flush=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def trained_tokens_per_s(step: dict) -> float | None:
    """Completion tokens per second of the last step (its own time, without waiting for data)."""
    if not step.get("step_s"):
        return None
    return step.get("tokens", 0) / step["step_s"]


def live_table(
    snap: Snapshot,
    elapsed_s: float,
    events: list[str],
    placement: Mapping[str, str | None] | None = None,
) -> Table:
    """``placement``: the supervisor's child -> CUDA_VISIBLE_DEVICES; shown when any child is placed."""
    step = snap.last_step or {}
    table = Table(title=f"streamrl  {elapsed_s:6.0f} s", show_header=False, expand=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("policy version", str(snap.version))
    table.add_row("reward (last step)", _fmt(step.get("reward_mean")))
    for name, value in step.get("reward_parts", {}).items():
        table.add_row(f"  {name}", _fmt(value))
    for name, rate in step.get("reward_failure_rate", {}).items():
        table.add_row(f"  {name} failed", _failed(rate))
    if env := step.get("env"):
        table.add_row("turns / trajectory", _env_line(env))
    table.add_row("tokens/s generated", f"{snap.generate_tokens_per_s:,.0f}")
    table.add_row("tokens/s trained", _fmt(trained_tokens_per_s(step), ",.0f"))
    # the learner's model FLOP utilisation (docs/benchmarks.md): absent where the peak is unknown
    if step.get("mfu") is not None:
        table.add_row("learner MFU", _fmt(step["mfu"], ".1%"))
    table.add_row(
        "stream: unread / awaiting ack", f"{snap.stream_length - snap.pending} / {snap.pending}"
    )
    table.add_row("staleness (mean versions)", _fmt(step.get("staleness_mean"), ".2f"))
    table.add_row("off-policy", _off_policy_line(step))
    table.add_row("dead letters", str(snap.dead_letters))
    alive = describe_hosts(snap.actors) or "none"
    table.add_row("actors alive", f"{len(snap.actors)} on {len(snap.hosts)} host(s): {alive}")
    if placement and any(v is not None for v in placement.values()):
        table.add_row("GPUs", gpus.describe(placement))
    for line in events[-4:]:
        table.add_row("", f"[dim]{line}[/dim]")
    return table


def _env_line(env: dict) -> str:
    """A multi-turn step's trajectories: turns, the tool calls and the share that failed (when
    there are any), and the mean environment step time."""
    text = f"{env.get('turns', 0):.2f}"
    if env.get("tool_calls"):
        failed = sum(v for k, v in env.items() if k.startswith(env_stats.TOOL_FAILED))
        text += f" tools={env['tool_calls']:.2f} tools_failed={failed / env['tool_calls']:.0%}"
    return text + f" env_step={env.get('step_s', 0) * 1e3:.1f}ms"


def plain_line(snap: Snapshot, elapsed_s: float, progress: RunProgress | None = None) -> str:
    step = snap.last_step or {}
    parts = "".join(f"{name}={_fmt(v)} " for name, v in step.get("reward_parts", {}).items())
    parts += "".join(
        f"{name}:failed={rate:.0%} " for name, rate in step.get("reward_failure_rate", {}).items()
    )
    if env := step.get("env"):
        parts += f"turns={_env_line(env)} "
    where = f"{progress.text()} " if progress is not None else ""
    return (
        f"[{elapsed_s:5.0f}s] {where}v{snap.version} reward={_fmt(step.get('reward_mean'))} "
        f"{parts}gen={snap.generate_tokens_per_s:,.0f} tok/s "
        f"train={_fmt(trained_tokens_per_s(step), ',.0f')} tok/s unread={snap.stream_length - snap.pending} "
        f"stale={_fmt(step.get('staleness_mean'), '.2f')} actors={len(snap.actors)}"
    )


def summary(
    steps: list[dict],
    started_unix: float,
    wall_s: float,
    events: list[str],
    cfg=None,
    plots: str | Path | None = None,
) -> str:
    """The end-of-run summary; ``cfg`` (the run's config) supplies the target, none shows no
    target line; ``plots``: where the run's plots went (``launch.plot``), or why there are none."""
    if not steps:
        return f"run ended after {wall_s:.0f} s with no learner step (see logs under the run directory)"

    def mean(key: str, chunk: list[dict]) -> float | None:
        # a step that trained nothing has NaN figures: not a value to average
        vals = [s[key] for s in chunk if s.get(key) is not None and not _nan(s[key])]
        return statistics.fmean(vals) if vals else None

    def part(name: str, chunk: list[dict]) -> float | None:
        vals = [s["reward_parts"][name] for s in chunk if name in s.get("reward_parts", {})]
        return statistics.fmean(vals) if vals else None

    head, tail = steps[:5], steps[-5:]
    tokens = sum(s.get("tokens", 0) for s in steps)
    lines = [
        "run summary",
        f"  wall time            {wall_s:.0f} s",
        f"  learner steps        {steps[-1].get('step')}   policy versions {steps[-1].get('version')}",
        f"  reward               {_fmt(mean('reward_mean', head))} (first 5 steps) -> {_fmt(mean('reward_mean', tail))} (last 5)",
        *(
            f"    {name:<18} {_fmt(part(name, head))} -> {_fmt(part(name, tail))}"
            for name in dict.fromkeys(n for s in steps for n in s.get("reward_parts", {}))
        ),
        *_target_lines(steps, started_unix, cfg),
        f"  tokens trained       {tokens:,} ({tokens / max(wall_s, 1e-9):,.0f}/s over the run)",
        f"  staleness            mean {_fmt(mean('staleness_mean', steps), '.2f')} versions",
        f"  off-policy           IS ESS mean {_fmt(mean('is_ess', steps), '.3f')}, KL(mu||pi_prox) "
        f"mean {_fmt(mean('behaviour_kl', steps), '.2e')}, stale tokens "
        f"{_fmt(mean('stale_token_fraction', steps), '.1%')}",
        f"  learner idle         {_fmt(mean('learner_idle_fraction', steps), '.0%')} of its time "
        "(waiting for data)",
    ]
    restarts = [e for e in events if "restarted" in e]
    if restarts:
        lines.append(f"  restarts             {len(restarts)}")
    if plots is not None:
        lines.append(f"  plots                {plots}")
    return "\n".join(lines)


def _target_lines(steps: list[dict], started_unix: float, cfg) -> list[str]:
    if cfg is None or not target.bars(cfg.run):
        return []
    at = time_to_target(steps, started_unix, target.Target.of(cfg.run, cfg.reward_ranges))
    reached = f"reached at {at:.0f} s" if at is not None else "not reached"
    return [f"  target               {target.describe(cfg.run)}: {reached}"]
