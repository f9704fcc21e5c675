"""``streamrl plot RUN_DIR [--out DIR]``: a run's learner step rows as PNGs, against steps and
wall time.

One figure per x axis (``steps.png``, ``wall_time.png`` under ``<run.dir>/plots``, or ``--out``),
a panel per measure: reward and its parts, reward std, loss, KL (to the reference or the behaviour
policy, and the data's drift KL(mu || pi_prox)), entropy, grad norm, learning rate, completion
length, the shares (clip fraction, IS ESS, IS cap, stale tokens, truncated completions, learner
idle), tokens/s, staleness, time per phase; wall time counts from the run's launch. A run
writes them once at its end (``launch.run``). matplotlib is the ``plot`` extra; without it
the command fails naming it.

The run directory is read, and written only where the user says: ``<run.dir>/plots`` only when
nobody but this user can change the run directory (``configs.runfiles.check_trusted``; another
user's run is refused, in one line naming ``--out``), and ``--out`` only when it is this user's
too. ``plots`` is made and opened without following a link (one planted there is refused), and
each PNG is written under an exclusive temporary name and renamed into place (``write_new``):
0600, or 0644 where the umask lets others read.
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamrl.configs.errors import ConfigError
from streamrl.configs.runfiles import check_trusted, read_run_file, write_new
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
        "reward std (within groups)": {"reward std": _get("reward_std")},
        "loss": {"loss": _get("loss")},
        "KL": {"kl": _get("kl"), "KL(mu || pi_prox)": _get("behaviour_kl")},
        "entropy": {"entropy": _get("entropy")},
        "grad norm": {"grad norm": _get("grad_norm")},
        "learning rate": {"lr": _get("lr")},
        "completion length (tokens)": {
            "mean": _completions("mean_length"),
            "max": _completions("max_length"),
        },
        "shares": {
            "clip fraction": _get("clip_fraction"),
            "IS ESS": _get("is_ess"),
            "at the IS cap": _get("is_truncated_fraction"),
            "stale tokens": _get("stale_token_fraction"),
            "completions at the token budget": _completions("clipped_ratio"),
            "learner idle": _get("learner_idle_fraction"),
        },
        "tokens/s trained": {"tokens/s": _get("tokens_per_s")},
        "staleness (versions)": {"mean": _get("staleness_mean"), "max": _get("staleness_max")},
        "time per phase (s)": {"waiting for data": _get("wait_s"), "training": _get("step_s")},
    }


def _completions(key: str) -> Callable[[dict], float | None]:
    return lambda row: row.get("completions", {}).get(key)


def series(
    rows: list[dict], x: str, started: float | None = None
) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """panel -> line -> (xs, ys), the rows that lack the value left out; ``x`` is ``step`` or
    ``wall_s``: seconds since ``started`` (the run's launch, so start-up is on the axis), or
    without it since the first row's end minus its own wait and step time."""
    first = rows[0]["time"] - rows[0].get("step_s", 0.0) - rows[0].get("wait_s", 0.0)
    # a resumed run's launch comes after its earlier rows
    start = first if started is None else min(started, first)
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


def figure(rows: list[dict], x: str, started: float | None = None) -> Any:
    """The matplotlib figure of ``series(rows, x, started)``, two panels a row, not yet saved;
    ImportError without matplotlib (``MISSING`` says what to install)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    data = series(rows, x, started)
    height = -(-len(data) // 2)
    inches = 2.4 * height
    fig, axes = plt.subplots(height, 2, figsize=(12, inches), sharex=True)
    # fixed margins for the fixed grid: tight_layout measured every text and took half the
    # plotting time (~1 s a figure), which every run pays at its end
    fig.subplots_adjust(
        left=0.06, right=0.99, bottom=0.55 / inches, top=1 - 0.3 / inches, hspace=0.32, wspace=0.16
    )
    # an odd number of panels leaves the grid's last axis empty
    for ax, (title, lines) in zip(axes.flat, data.items(), strict=False):
        for label, (xs, ys) in lines.items():
            ax.plot(xs, ys, label=label)
        ax.set_title(title, fontsize=10)
        if len(lines) > 1:
            ax.legend(fontsize=8)
    bottom = list(axes[-1])
    if len(data) % 2:
        axes[-1][1].remove()
        # the panel above the empty slot ends its column: its x axis gets the labels
        bottom[1] = axes[-2][1]
        bottom[1].xaxis.set_tick_params(labelbottom=True)
    for ax in bottom:
        ax.set_xlabel("learner step" if x == "step" else "wall time since launch (s)")
    if x != "step":
        # the axis spans the run from its launch, start-up included (the axes share it)
        axes.flat[0].set_xlim(left=0)
    return fig


def launched(run_dir: str | Path) -> float | None:
    """When ``streamrl run`` launched the run (its ``run.json``); None for a run that has none (its
    learner started by hand) or that is not this user's own."""
    try:
        started = json.loads(read_run_file(run_dir, "run.json")).get("started")
    except (ConfigError, OSError, ValueError, AttributeError):
        return None
    return float(started) if isinstance(started, (int, float)) else None


def write(run_dir: str | Path, out: str | Path | None = None) -> Path | None:
    """``{steps,wall_time}.png`` in ``out`` (None: ``<run_dir>/plots``), the folder returned;
    None when the run has no step row. ConfigError, before anything is written, when the
    folder is not one only this user controls (``destination``); ImportError without
    matplotlib."""
    rows = [r for r in read_steps(run_dir) if "step" in r and "time" in r]
    if not rows:
        return None
    folder = destination(run_dir, out)
    shared_read = _umask() & 0o044 == 0
    started = launched(run_dir)
    for x, name in (("step", "steps.png"), ("wall_s", "wall_time.png")):
        fig = figure(rows, x, started)
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=80)
        # pyplot keeps every figure it made until closed
        from matplotlib import pyplot as plt

        plt.close(fig)
        write_new(folder / name, png.getvalue(), shared_read=shared_read)
    return folder


def at_end(run_dir: str | Path) -> Path | str | None:
    """What a run shows at its end (``launch.run``): where its plots went, or why none."""
    try:
        return write(run_dir)
    except ImportError:
        return MISSING
    except ConfigError as exc:
        return str(exc)


def destination(run_dir: str | Path, out: str | Path | None) -> Path:
    """The folder the PNGs go in, made if missing: ``out`` if given, else ``<run_dir>/plots``.
    ConfigError, in one line, unless only this user can change it and the directories above."""
    if out is not None:
        _check_trusted(out, "--out", "pass --out a directory of yours")
        Path(out).mkdir(mode=0o755, parents=True, exist_ok=True)
        # --out is the user's own path: a link of theirs is followed (check_trusted vetted it)
        return _own_dir(Path(out), follow=True)
    _check_trusted(
        run_dir,
        "RUN_DIR",
        "not writing its plots there: pass --out DIR, a directory of yours, to write them there",
    )
    return _own_dir(Path(run_dir) / PLOTS_DIR, follow=False)


def _check_trusted(path: str | Path, key: str, advice: str) -> None:
    try:
        check_trusted(path, key=key)
    except ConfigError as exc:
        # check_trusted's first clause says what is wrong; its advice is a run's, not plot's
        raise ConfigError(f"streamrl plot: {str(exc).split(';')[0]}; {advice}") from None


def _own_dir(path: Path, follow: bool) -> Path:
    """``path``, made (0755 less the umask) if missing, as a directory of this user nobody else
    may write; ``follow=False``: a link at ``path`` is refused, never followed (its parent is
    opened once and the directory made and opened below it)."""
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            os.mkdir(path.name, 0o755, dir_fd=parent)
        except FileExistsError:
            pass
        flags = os.O_RDONLY | os.O_DIRECTORY | (0 if follow else os.O_NOFOLLOW)
        try:
            fd = os.open(path.name, flags, dir_fd=parent)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise ConfigError(
                f"streamrl plot: {path} is a link or not a directory; plot writes through no "
                "link: remove it, or pass --out DIR, a directory of yours"
            ) from None
    finally:
        os.close(parent)
    info = os.fstat(fd)
    os.close(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise ConfigError(
            f"streamrl plot: {path} is not a directory only you can write (uid {info.st_uid}, "
            f"mode {info.st_mode & 0o7777:o}): pass --out DIR, a directory of yours"
        )
    return path


def _umask() -> int:
    """The process's umask (read by setting it; set back at once)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamrl plot", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run directory (its learner_steps.jsonl)")
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="write the PNGs in DIR (made if missing; yours only) instead of RUN_DIR/plots, "
        "which is written only when the run directory is yours only",
    )
    args = parser.parse_args(argv)
    if not (Path(args.run_dir) / "learner_steps.jsonl").is_file():
        print(f"streamrl plot: {args.run_dir}: no learner_steps.jsonl", file=sys.stderr)
        return 2
    try:
        out = write(args.run_dir, args.out)
    except ImportError:
        print(MISSING, file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if out is None:
        print(f"streamrl plot: {args.run_dir}: no learner step yet", file=sys.stderr)
        return 2
    print(f"plots in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
