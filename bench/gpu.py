"""`python -m bench.gpu`: every check a lent GPU machine runs, one subprocess each with its own
timeout, then a summary.

    python -m bench.gpu [--only NAME,...] [--budget-s 330] [--out FILE]   (on a CUDA host)
    python -m bench.gpu --cpu                                             (smoke run, tiny shapes)

The machine is lent for minutes (one H100/H200, 16 cores, no internet), so the checks run in
order of importance under one overall budget: each gets its own timeout, cut to what the budget
has left, and its process group is killed when it runs out. A check whose module is not in this
tree is reported as "module missing" and skipped, so checks written elsewhere are listed here by
module name before they land. ``--cpu`` runs the same list on CPU: tiny shapes, and ``--help``
for the checks whose CPU form is not ours, so the orchestrator itself is tested without a GPU.
Exit status 0 only if every check that ran passed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what each check's report keeps of its output
TAIL_CHARS = 1500


@dataclass(frozen=True)
class Check:
    name: str
    # run as ``python -m module``
    module: str
    gpu_args: tuple[str, ...]
    cpu_args: tuple[str, ...]
    timeout_s: float
    what: str


CUDA_TESTS = ("-q", "-p", "no:cacheprovider", "tests/test_learner_cuda.py",
              "tests/test_learner_packed_attention_cuda.py", "tests/test_weightsync_cuda.py",
              "tests/test_actors_cuda.py", "tests/test_weightsync_publisher.py")  # fmt: skip
# In order of importance. The first four fit the default budget (330 s: with the installs, one
# call of about 6 minutes); the rest run in a second call (--only packing-0.5b,longtail,...).
CHECKS = (
    Check(
        "cuda-tests",
        "pytest",
        CUDA_TESTS,
        # on a CPU they would skip, or rerun what make test runs: collecting them is the smoke
        ("--collect-only", *CUDA_TESTS),
        75,
        "the CUDA tests (they skip on a CPU host): learner, packed attention, weight transports "
        "(cuda_ipc across processes), CUDA-graph decode, and the publisher's GPU path",
    ),
    Check(
        "publish-ipc-0.5b",
        "bench.weightsync",
        ("--shape", "qwen05b", "--device", "cuda", "--actor-device", "cuda", "--transport", "cuda_ipc"),
        ("--shape", "tiny", "--device", "cpu", "--actor-device", "cpu", "--transport", "cuda_ipc"),
        45,
        "publish -> applied at Qwen2.5-0.5B's shape to a CUDA actor over cuda_ipc, against a "
        "device-to-device copy of the same bytes",
    ),
    Check(
        "decode-256",
        "bench.decode",
        ("--device", "cuda", "--shape", "qwen05b", "--slots", "256"),
        ("--cpu",),
        90,
        "hf engine decode tokens/s at 256 slots with CUDA graphs (and without) against "
        "model.generate with a static cache, compiled",
    ),
    Check(
        "learner-0.5b",
        "bench.learner_memory",
        ("--measure", "--device", "cuda", "--rows", "step", "--tokens", "16384", "--seconds", "5"),
        # its CPU smoke is tests/test_bench_learner_memory.py's
        ("--help",),
        120,
        "the learner's peak memory, tokens/s and MFU at Qwen2.5-0.5B's shape and 16,384-token "
        "micro-batches, against a plain torch forward and backward and its own unchunked step",
    ),
    Check(
        "packing-0.5b",
        "bench.learner_memory",
        ("--measure", "--device", "cuda", "--rows", "packing", "--tokens", "16384", "--seconds", "5"),
        ("--help",),
        120,
        "the learner on a long tail of short samples packed several to a row: transformers' 4D "
        "mask against torch's variable-length flash attention",
    ),
    Check(
        "longtail",
        "bench.longtail",
        ("--device", "cuda", "--seeds", "0", "--grid", "3e-4:0", "--cap-s", "80"),
        ("--help",),
        240,
        "the long-tail task on the GPU: the synchronous loop wholly on it against streamrl "
        "with its learner and actors on it",
    ),
    Check(
        "publish-shm-0.5b",
        "bench.weightsync",
        ("--shape", "qwen05b", "--device", "cuda", "--actor-device", "cpu,cuda"),
        ("--shape", "tiny", "--device", "cpu", "--actor-device", "cpu"),
        90,
        "publish -> applied over shm at Qwen2.5-0.5B's shape, to a CPU actor and to a CUDA actor",
    ),
)  # fmt: skip


@dataclass
class Result:
    name: str
    status: str
    seconds: float
    output: str

    @property
    def tail(self) -> str:
        return self.output[-TAIL_CHARS:]


def available(check: Check) -> bool:
    return importlib.util.find_spec(check.module) is not None


def run_check(check: Check, cpu: bool, timeout_s: float) -> Result:
    """Run one check in its own process group; "ok", "failed (rc N)", "timeout" or "module missing"."""
    if not available(check):
        return Result(check.name, "module missing", 0.0, f"no module {check.module} in this tree")
    args = check.cpu_args if cpu else check.gpu_args
    cmd = [sys.executable, "-m", check.module, *args]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        status = "ok" if proc.returncode == 0 else f"failed (rc {proc.returncode})"
    except subprocess.TimeoutExpired:
        # the check's own children (Redis, subscribers, learners) go with it
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        status = f"timeout ({timeout_s:.0f} s)"
    return Result(check.name, status, time.monotonic() - started, out or "")


def run_all(checks: list[Check], cpu: bool, budget_s: float, echo=print) -> list[Result]:
    deadline = time.monotonic() + budget_s
    results = []
    for check in checks:
        left = deadline - time.monotonic()
        if left <= 1:
            results.append(Result(check.name, "skipped (budget spent)", 0.0, ""))
            continue
        echo(f"== {check.name}: {check.what}", flush=True)
        result = run_check(check, cpu, min(check.timeout_s, left))
        # the whole output goes to the log: a failure's cause is rarely in the summary's tail
        echo(result.output, flush=True)
        echo(f"== {check.name}: {result.status} in {result.seconds:.0f} s", flush=True)
        results.append(result)
    return results


def summary(results: list[Result], cpu: bool) -> str:
    from bench.__main__ import machine
    from bench.cli import gpu_name

    lines = [
        "## GPU check (`python -m bench.gpu`)",
        "",
        "One command for a lent GPU machine (one H100/H200, 16 cores, no internet, minutes): "
        "`python -m bench.gpu --out docs/bench/gpu.md` runs each check below as a subprocess "
        "with its own timeout under one budget (`--budget-s`, 330 s), kills a check's process "
        "group when its time is up, and reports a module not in the tree as missing. "
        "`python -m bench.gpu --cpu` is the same run at tiny shapes on CPU (tests/test_bench_gpu.py). "
        "Checks: "
        + "; ".join(
            f"`{c.name}` (`python -m {c.module} {' '.join(c.gpu_args)}`): {c.what}" for c in CHECKS
        )
        + ".",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M')} · {machine()} · "
        f"{'CPU smoke run (--cpu)' if cpu else gpu_name()}",
        "",
        "| check | status | seconds |",
        "|---|---|---|",
        *(f"| {r.name} | {r.status} | {r.seconds:.0f} |" for r in results),
    ]
    for r in results:
        if r.tail:
            lines += ["", f"### {r.name}", "", "```", r.tail.strip(), "```"]
    return "\n".join(lines) + "\n"


def passed(results: list[Result]) -> bool:
    return all(r.status in ("ok", "module missing") for r in results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="smoke run on CPU at tiny shapes")
    parser.add_argument("--only", default=None, help="comma-separated check names")
    parser.add_argument("--budget-s", type=float, default=330.0, help="for all checks together")
    parser.add_argument("--out", type=Path, default=None, help="write the summary here too")
    args = parser.parse_args(argv)
    checks = list(CHECKS)
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {c.name for c in CHECKS})
        if unknown:
            parser.error(f"unknown checks {unknown}; known: {[c.name for c in CHECKS]}")
        checks = [c for c in CHECKS if c.name in names]
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            parser.error("no CUDA device here: run with --cpu for the smoke run")
    results = run_all(checks, args.cpu, args.budget_s)
    text = summary(results, args.cpu)
    print(text, flush=True)
    if args.out is not None:
        args.out.write_text(text)
    return 0 if passed(results) else 1


if __name__ == "__main__":
    sys.exit(main())
