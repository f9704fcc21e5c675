"""``streamrl plot RUN_DIR``: a run's learner step rows as PNGs, against steps and wall time.

One figure per x axis (``steps.png``, ``wall_time.png`` under ``<run.dir>/plots``), a panel
per measure: reward and its parts, KL, entropy, tokens/s, staleness, time per phase. A run
writes them once at its end (``launch.run``). matplotlib is the ``plot`` extra; without it
the command fails naming it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamrl.launch.status import read_steps

PLOTS_DIR = "plots"
MISSING = "streamrl plot needs matplotlib: pip install 'streamrl[plot]'"

# panel title -> {line label: value of a step row, None where the row has none}
Series = dict[str, Callable[[dict], float | None]]


def _get(key: str) -> Callable[[dict], float | None]:
    return lambda row: row.get(key)


def panels(rows: list[dict]) -> dict[str, Series]:
    """What each panel draws; the reward parts are the ones the rows name."""
    parts = dict.fromkeys(name for row in rows for name in row.get("reward_parts", {}))
    reward: Series = {"reward": _get("reward_mean")}
    for name in parts:
        reward[name] = lambda row, name=name: row.get("reward_parts", {}).get(name)
    return {
        "reward": reward,
        "KL": {"kl": _get("kl")},
        "entropy": {"entropy": _get("entropy")},
        "tokens/s trained": {"tokens/s": _get("tokens_per_s")},
        "staleness (versions)": {"mean": _get("staleness_mean"), "max": _get("staleness_max")},
        "time per phase (s)": {"waiting for data": _get("wait_s"), "training": _get("step_s")},
    }


def series(rows: list[dict], x: str) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """panel -> line -> (xs, ys), the rows that lack the value left out; ``x`` is ``step`` or
    ``wall_s`` (seconds since the first row's end minus its own step time: the run's start)."""
    start = rows[0]["time"] - rows[0].get("step_s", 0.0) - rows[0].get("wait_s", 0.0)
    xs = [row["step"] if x == "step" else row["time"] - start for row in rows]
    out: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for title, lines in panels(rows).items():
        out[title] = {}
        for label, value in lines.items():
            points = [(xv, value(row)) for xv, row in zip(xs, rows, strict=True)]
            kept = [(xv, yv) for xv, yv in points if yv is not None]
            if kept:
                out[title][label] = ([p[0] for p in kept], [float(p[1]) for p in kept])
    return out


def figure(rows: list[dict], x: str) -> Any:
    """The matplotlib figure of ``series(rows, x)``, not yet saved; ImportError without
    matplotlib (``MISSING`` says what to install)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    data = series(rows, x)
    fig, axes = plt.subplots(len(data), 1, figsize=(8, 2.4 * len(data)), sharex=True)
    for ax, (title, lines) in zip(axes, data.items(), strict=True):
        for label, (xs, ys) in lines.items():
            ax.plot(xs, ys, label=label)
        ax.set_title(title, fontsize=10)
        if len(lines) > 1:
            ax.legend(fontsize=8)
    axes[-1].set_xlabel("learner step" if x == "step" else "wall time (s)")
    fig.tight_layout()
    return fig


def write(run_dir: str | Path) -> Path | None:
    """``<run_dir>/plots/{steps,wall_time}.png``; None when the run has no step row.
    ImportError without matplotlib."""
    rows = [r for r in read_steps(run_dir) if "step" in r and "time" in r]
    if not rows:
        return None
    out = Path(run_dir) / PLOTS_DIR
    out.mkdir(exist_ok=True)
    for x, name in (("step", "steps.png"), ("wall_s", "wall_time.png")):
        fig = figure(rows, x)
        fig.savefig(out / name, dpi=80)
        # pyplot keeps every figure it made until closed
        from matplotlib import pyplot as plt

        plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamrl plot", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run directory (its learner_steps.jsonl)")
    args = parser.parse_args(argv)
    if not (Path(args.run_dir) / "learner_steps.jsonl").is_file():
        print(f"streamrl plot: {args.run_dir}: no learner_steps.jsonl", file=sys.stderr)
        return 2
    try:
        out = write(args.run_dir)
    except ImportError:
        print(MISSING, file=sys.stderr)
        return 2
    if out is None:
        print(f"streamrl plot: {args.run_dir}: no learner step yet", file=sys.stderr)
        return 2
    print(f"plots in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
