"""Launch -> the first trained step of the CPU demo, and where that time goes.

    python -m bench.startup [--runs N]      (writes docs/bench/startup.md)

Measured once the venv and the demo policy exist (this builds the policy and the data first,
untimed, as the first ``make run`` would). Each run is
``python -m streamrl.launch --config configs/demo_cpu.yaml --actors 2 run.max_steps=1`` in a
fresh run directory, timed from just before the launch to the first step's record in
``learner_steps.jsonl``. The breakdown comes from what the processes log: the ``startup`` line
the learner and each actor write when ready (``runtime.startup_phases.Phases``: their phases from their
own process start), each actor's "first group published" line, and the step record's own
wait and step times.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench.cli import command_line, publish

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/demo_cpu.yaml"
OUT = Path("docs/bench/startup.md")
TIMEOUT_S = 300
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _at(line: str) -> float | None:
    """The unix time of a logging line (``%(asctime)s``, this host's local time)."""
    match = _STAMP.match(line)
    if match is None:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _startup(log: Path) -> dict | None:
    for line in log.read_text(errors="replace").splitlines():
        if " startup {" in line:
            return json.loads(line[line.index(" startup {") + len(" startup ") :])
    return None


def _first_published(log: Path) -> float | None:
    for line in log.read_text(errors="replace").splitlines():
        if line.endswith("first group published"):
            return _at(line)
    return None


def prepare_demo() -> None:
    """Make the demo policy and data if missing (``streamrl example demo``), outside the timing."""
    from streamrl.examples.assets_cli import example_targets, make

    make(example_targets("demo", None, None))


def demo_launch(
    run_dir: Path, name: str, overrides: list[str], tree: Path = ROOT
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a demo run (learner + 2 actors) of the code in ``tree``, in
    ``run_dir``, named ``<name>-<run_dir's name>``."""
    env = dict(
        os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(tree)
    )
    cmd = [sys.executable, "-m", "streamrl.launch", "--config", CONFIG, "--actors", "2",
           f"run.dir={run_dir}", f"run.name={name}-{run_dir.name}", *overrides]  # fmt: skip
    return cmd, env


def one_run(run_dir: Path, tree: Path = ROOT) -> dict:
    """One launch of the code in ``tree`` until the learner's first step is recorded; returns
    times relative to launch."""
    cmd, env = demo_launch(run_dir, "startup", ["run.max_steps=1"], tree)
    launched = time.time()
    proc = subprocess.Popen(
        cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # Ctrl-C: the launcher stops its children in order
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    if proc.returncode != 0 or not (run_dir / "learner_steps.jsonl").exists():
        raise RuntimeError(f"launch failed ({proc.returncode}), logs in {run_dir}: {out[-2000:]}")
    steps = (run_dir / "learner_steps.jsonl").read_text().splitlines()
    first = json.loads(steps[0])
    logs = run_dir / "logs"
    learner = _startup(logs / "learner.log")
    actors = {}
    for log in sorted(logs.glob("actor-*.log")):
        phases = _startup(log)
        if phases is not None:
            phases["first_published"] = _first_published(log)
            actors[log.stem.removeprefix("actor-")] = phases
    return {
        "first_step": first["time"] - launched,
        "step_s": first.get("step_s"),
        "wait_s": first.get("wait_s"),
        "learner": _relative(learner, launched),
        "actors": {name: _relative(a, launched) for name, a in actors.items()},
    }


def _relative(phases: dict | None, launched: float) -> dict | None:
    if phases is None:
        return None
    out = {
        "process_start": phases["process_start"] - launched,
        "ready": phases["ready"] - launched,
        "cpu_s": phases["cpu_s"],
        "seconds": phases["seconds"],
    }
    if phases.get("first_published") is not None:
        out["first_published"] = phases["first_published"] - launched
    return out


def _phase_line(who: str, p: dict) -> str:
    parts = ", ".join(f"{name} {s:.2f}" for name, s in p["seconds"].items())
    extra = (
        f"; first group published at {p['first_published']:.2f}" if "first_published" in p else ""
    )
    return (
        f"- {who}: process started at {p['process_start']:.2f} s, ready at {p['ready']:.2f} s "
        f"after {p['cpu_s']:.2f} CPU-s ({parts}){extra}"
    )


def _stagger() -> str:
    from streamrl.configs import load_config

    if load_config(CONFIG, []).actor.staggered_start:
        return "; the preset's `actor.staggered_start`: a1 starts once a0 is up"
    return ""


def report(runs: list[dict], load: tuple[float, float, float], command: str) -> str:
    from bench.__main__ import machine

    firsts = [r["first_step"] for r in runs]
    lines = [
        "## Start-up: launch -> first trained step",
        "",
        f"{time.strftime('%Y-%m-%d')} · {machine()} · load average {load[0]:.1f} at start · "
        f"command: `{command}`",
        "",
        f"`streamrl run --config demo_cpu` (learner of one, 2 hf actors{_stagger()}), policy and "
        f"data already built. **Launch -> first trained step: median {statistics.median(firsts):.1f} s** over "
        f"{len(runs)} runs ({', '.join(f'{f:.1f}' for f in firsts)} s). Target: <= 8 s on 2 cores.",
        "",
        "Breakdown of the median run, seconds from the launch (phases in each process's own "
        "order, from its process start; `imports` = interpreter, imports and config):",
        "",
    ]
    median_run = sorted(runs, key=lambda r: r["first_step"])[len(runs) // 2]
    if median_run["learner"] is not None:
        lines.append(_phase_line("learner", median_run["learner"]))
    for name, actor in median_run["actors"].items():
        if actor is not None:
            lines.append(_phase_line(f"actor {name}", actor))
    lines.append(
        f"- first step recorded at {median_run['first_step']:.2f} s (its wait for data "
        f"{median_run['wait_s']:.2f} s, the step {median_run['step_s']:.2f} s)"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        help="another checkout (its runs/ holding the demo policy and data): its runs alternate "
        "with this tree's, and its median is reported next to this one",
    )
    args = parser.parse_args(argv)
    prepare_demo()
    load = os.getloadavg()
    runs, others = [], []
    # kept when a run fails, for its logs
    tmp = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    for i in range(args.runs):
        if args.against is not None:
            others.append(one_run(tmp / f"against{i}", args.against.resolve()))
            print("against", json.dumps(others[-1]), flush=True)
        runs.append(one_run(tmp / f"r{i}"))
        print(json.dumps(runs[-1]), flush=True)
    shutil.rmtree(tmp)
    text = report(runs, load, command_line("bench.startup", argv))
    if others:
        firsts = [r["first_step"] for r in others]
        text += (
            f"\nBack to back, alternating with `{args.against}` (`--against`): its launch -> first "
            f"trained step median {statistics.median(firsts):.1f} s "
            f"({', '.join(f'{f:.1f}' for f in firsts)} s); this tree "
            f"{statistics.median(r['first_step'] for r in runs):.1f} s.\n"
        )
    publish(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
