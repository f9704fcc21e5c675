"""The multi-turn CPU demo: time to its target, per seed, and what the second turn adds.

    python -m bench.multiturn [--seeds 0,1,2] [--cap-s 600]

Each run is ``python -m streamrl.launch --config examples/multiturn/config.yaml --actors 2``
(what ``make run CONFIG=examples/multiturn/config.yaml`` starts), one seed at a time, in
runs/bench-multiturn/seed<N>, from a built (warm-started) policy: the policy folder is built
beforehand and not timed. Wall time counts from the launch. Reported per seed: the time and
steps to the config's target (``run.target_*``), the load average around the run (the machine
is shared), and at the target the share of the successes that came at the second attempt
(``second_turn_exact`` over ``reverse_digits_exact``). Writes docs/bench/multiturn.md and the
plot docs/img/multiturn_curves.png (20-step means of reward and exact match against wall time).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.cli import command_line, publish
from streamrl.configs import load_config
from streamrl.launch.status import read_steps
from streamrl.learner import target

CONFIG = "examples/multiturn/config.yaml"
ROOT = Path("runs/bench-multiturn")
SECTION = Path("docs/bench/multiturn.md")
IMG = Path("docs/img/multiturn_curves.png")
EXACT, SECOND = "reverse_digits_exact", "second_turn_exact"
# the learner stops itself at max_time_s after its own start-up; past cap + grace the run is stopped
GRACE_S = 120


def run_seed(seed: int, cap_s: float) -> dict:
    """One launch of the demo; its step rows, launch time and the load averages around it."""
    run_dir = ROOT / f"seed{seed}"
    # a fresh run: launch would resume from a checkpoint left there
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = load_config(CONFIG, [f"run.seed={seed}"])
    # the warm start is made before the clock starts (make run makes it once, then reuses it)
    from streamrl.examples.assets_cli import example_targets, make

    make(example_targets("multiturn", cfg.model.path, cfg.data.path), seed)
    load_before = os.getloadavg()
    started = time.time()
    subprocess.run(
        [sys.executable, "-m", "streamrl.launch", "--config", CONFIG, "--actors", "2",
         f"run.seed={seed}", f"run.dir={run_dir}", f"run.max_time_s={cap_s}"],
        check=True, timeout=cap_s + GRACE_S, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return {
        "seed": seed,
        "started": started,
        "wall_s": time.time() - started,
        "load_before": load_before[0],
        "load_after": os.getloadavg()[0],
        "steps": read_steps(run_dir),
    }


def rolling(values: list[float], window: int) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def outcome(run: dict, goal: target.Target) -> dict:
    """Time and steps to the target, and the second turn's share of the successes there."""
    steps, window = run["steps"], goal.window
    end = goal.reached_at(steps)
    at = steps[end - window + 1 : end + 1] if end is not None else steps[-window:]
    exact = statistics.fmean(s["reward_parts"].get(EXACT, 0.0) for s in at) if at else 0.0
    second = statistics.fmean(s["reward_parts"].get(SECOND, 0.0) for s in at) if at else 0.0
    return {
        "seconds": None if end is None else steps[end]["time"] - run["started"],
        "step": None if end is None else steps[end]["step"],
        "exact": exact,
        "second_share": second / exact if exact else 0.0,
        "reward": statistics.fmean(s["reward_mean"] for s in at) if at else 0.0,
        "turns": statistics.fmean(s.get("env", {}).get("turns", 0.0) for s in at) if at else 0.0,
    }


def plot(runs: list[dict], bars: dict[str, float], window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, run in enumerate(runs):
        steps = run["steps"]
        t = [s["time"] - run["started"] for s in steps]
        reward = rolling([s["reward_mean"] for s in steps], window)
        exact = rolling([s["reward_parts"].get(EXACT, 0.0) for s in steps], window)
        second = rolling([s["reward_parts"].get(SECOND, 0.0) for s in steps], window)
        ax.plot(t, reward, color=f"C{i}", lw=1.2, label=f"seed {run['seed']}: reward")
        ax.plot(
            t, exact, color=f"C{i}", lw=1, ls="--", label="exact (last answer)" if not i else None
        )
        ax.plot(
            t, second, color=f"C{i}", lw=0.8, ls=":", label="exact at turn 2" if not i else None
        )
    for bar in bars.values():
        ax.axhline(bar, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("wall time since launch (s)")
    ax.set_ylabel(f"{window}-step mean")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(
        "multi-turn CPU demo (examples/multiturn/config.yaml), learner + 2 actors", fontsize=10
    )
    fig.tight_layout()
    IMG.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMG, dpi=110)
    plt.close(fig)


def section(runs: list[dict], cap_s: float, argv: list[str] | None) -> str:
    cfg = load_config(CONFIG, [])
    bars, window = target.bars(cfg.run), cfg.run.target_window
    plot(runs, bars, window)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## The multi-turn CPU demo",
        "",
        f"{now} · {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()} · "
        f"`{command_line('bench.multiturn', argv)}`",
        "",
        f"`{CONFIG}` (docs/multiturn.md): learner + 2 actors from launch, the policy built "
        f"beforehand. Target: {target.describe(cfg.run)}. Cap {cap_s:.0f} s. The machine is "
        "shared: the load average (1 min) before and after each run says how much.",
        "",
        "| seed | time to target | steps | reward / exact at the target (a miss: its last "
        f"{window} steps) | successes at turn 2 | turns / trajectory | load before → after |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        o = outcome(run, target.Target.of(cfg.run, cfg.reward_ranges))
        reached = f"{o['seconds']:.0f} s" if o["seconds"] is not None else f"not in {cap_s:.0f} s"
        lines.append(
            f"| {run['seed']} | {reached} | {o['step'] or len(run['steps'])} | "
            f"{o['reward']:.2f} / {o['exact']:.2f} | {o['second_share']:.0%} | {o['turns']:.2f} | "
            f"{run['load_before']:.1f} → {run['load_after']:.1f} |"
        )
    lines += [
        "",
        f"![reward and exact match against wall time, multi-turn demo]({IMG.relative_to('docs')})",
        "",
        "Solid: reward; dashed: exact match of the last answer (the target's measure); dotted: "
        "exact at the second attempt (its share of the successes is the column above).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0", help="comma-separated run seeds")
    parser.add_argument("--cap-s", type=float, default=600.0, help="run.max_time_s of each run")
    args = parser.parse_args(argv)
    runs = [run_seed(int(seed), args.cap_s) for seed in args.seeds.split(",")]
    publish(SECTION, section(runs, args.cap_s, argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
