"""What the terminal shows while a run is going, and the summary printed at its end."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from rich.table import Table

from streamrl.broker import env_stats
from streamrl.launch import placement as gpus
from streamrl.launch.status import Snapshot, time_to_target
from streamrl.learner import target


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _failed(rate: float) -> str:
    """A reward function's failure rate; past half it is what stops the run, so it stands out."""
    text = f"{rate:.0%}"
    return f"[bold red]{text}[/bold red]" if rate > 0.5 else text


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
    table.add_row(
        "stream: unread / awaiting ack", f"{snap.stream_length - snap.pending} / {snap.pending}"
    )
    table.add_row("staleness (mean versions)", _fmt(step.get("staleness_mean"), ".2f"))
    table.add_row("dead letters", str(snap.dead_letters))
    alive = ", ".join(f"{a['id']}@v{a.get('version', '?')}" for a in snap.actors) or "none"
    table.add_row("actors alive", f"{len(snap.actors)}: {alive}")
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


def plain_line(snap: Snapshot, elapsed_s: float) -> str:
    step = snap.last_step or {}
    parts = "".join(f"{name}={_fmt(v)} " for name, v in step.get("reward_parts", {}).items())
    parts += "".join(
        f"{name}:failed={rate:.0%} " for name, rate in step.get("reward_failure_rate", {}).items()
    )
    if env := step.get("env"):
        parts += f"turns={_env_line(env)} "
    return (
        f"[{elapsed_s:5.0f}s] v{snap.version} reward={_fmt(step.get('reward_mean'))} "
        f"{parts}gen={snap.generate_tokens_per_s:,.0f} tok/s "
        f"train={_fmt(trained_tokens_per_s(step), ',.0f')} tok/s unread={snap.stream_length - snap.pending} "
        f"stale={_fmt(step.get('staleness_mean'), '.2f')} actors={len(snap.actors)}"
    )


def summary(
    steps: list[dict], started_unix: float, wall_s: float, events: list[str], run=None
) -> str:
    """The end-of-run summary; ``run`` (cfg.run) supplies the target, none shows no target line."""
    if not steps:
        return f"run ended after {wall_s:.0f} s with no learner step (see logs under the run directory)"

    def mean(key: str, chunk: list[dict]) -> float | None:
        vals = [s[key] for s in chunk if s.get(key) is not None]
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
        *_target_lines(steps, started_unix, run),
        f"  tokens trained       {tokens:,} ({tokens / max(wall_s, 1e-9):,.0f}/s over the run)",
        f"  staleness            mean {_fmt(mean('staleness_mean', steps), '.2f')} versions",
    ]
    restarts = [e for e in events if "restarted" in e]
    if restarts:
        lines.append(f"  restarts             {len(restarts)}")
    return "\n".join(lines)


def _target_lines(steps: list[dict], started_unix: float, run) -> list[str]:
    bars = target.bars(run) if run is not None else {}
    if not bars:
        return []
    at = time_to_target(steps, started_unix, bars, run.target_window)
    reached = f"reached at {at:.0f} s" if at is not None else "not reached"
    return [f"  target               {target.describe(run)}: {reached}"]
