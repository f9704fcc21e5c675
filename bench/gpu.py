"""`python -m bench.gpu`: every check a lent GPU machine runs, one subprocess each with its own
timeout, then a summary.

    python -m bench.gpu [--only NAME,...] [--budget-s 300] [--out-dir DIR]   (on a CUDA host)
    python -m bench.gpu --cpu                                                (dry run, tiny shapes)

The machine is lent for minutes (one H100/H200, 16 cores, no internet), and a call whose script
dies or hangs returns nothing, so nothing a check measured may be lost: the versions of torch,
transformers, CUDA and the driver print first; each check's output is relayed line by line as it
comes (rows printed as measured survive a later timeout); the pytest checks run ``-v -rfE`` (a
failure or a timeout shows test names and tracebacks); and a check's end, by exit or by timeout,
kills and reaps every process it started, those in sessions of their own included
(``bench.process_tree``), so the next check gets the GPU to itself. The checks run in order:
the paths never run on a GPU first (cuda_ipc, CUDA graphs, varlen attention), each timeout cut
to what the budget has left. A check whose module is not in this tree is reported as "module
missing" and skipped. ``--cpu`` runs the same list on CPU: tiny shapes, test collection for the
CUDA tests (they skip on CPU) and ``--help`` where the CPU form is another test's, so the
orchestrator itself is tested without a GPU. The summary and the whole log are written under
``--out-dir`` (default ``$OUT``, the folder a lent machine sends back), never into docs/: the
docs page is written by hand from them. Exit status 0 only if every check that ran passed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.process_tree import become_subreaper, run_streamed

ROOT = Path(__file__).resolve().parents[1]
# what each check's report keeps of its output
TAIL_CHARS = 1500
PYTEST_GPU = ("-v", "-rfE", "-p", "no:cacheprovider")
PYTEST_CPU = ("--collect-only", "-q", "-p", "no:cacheprovider")


@dataclass(frozen=True)
class Check:
    name: str
    # run as ``python -m module``
    module: str
    gpu_args: tuple[str, ...]
    cpu_args: tuple[str, ...]
    # the seconds its timeout is measured from (see TIMEOUTS below), and the timeout in multiples
    base_s: float
    factor: float
    what: str

    @property
    def timeout_s(self) -> float:
        return round(self.base_s * self.factor)


def _tests(name: str, files: tuple[str, ...], base_s: float, factor: float, what: str) -> Check:
    return Check(name, "pytest", (*PYTEST_GPU, *files), (*PYTEST_CPU, *files), base_s, factor, what)


# TIMEOUTS. Each check's timeout is ``base_s`` times a stated ``factor``. ``base_s`` is the CPU
# dry run's time, measured on the 2-core CI machine under load (2026-11-29): the check's own
# ``--cpu`` run, or for a CUDA test file (those only skip on CPU) the CPU test of the same path,
# named beside it. Where nothing on CPU runs the path, it is the last lent GPU's time, said so.
# The factor covers what the dry run lacks: a CUDA context and cuBLAS per process (~5-10 s), the
# real shapes, torch.compile on a cold cache, and a margin of about 1.5x. The first five are the
# never-run paths and fit the default budget (300 s; their timeouts sum to 275 s; with the
# wheels' install, one call of 6 minutes); the next four are the second call (also <= 300 s);
# longtail only runs in a third call, if device time is left (docs/bench/gpu.md).
CHECKS = (
    # CPU: tests/test_weightsync_cuda_ipc.py (the protocol, a stand-in for CUDA) 15.6 s; on the
    # GPU three tests each spawn a CUDA process, hence 4x
    _tests("ipc-tests", ("tests/test_weightsync_cuda.py",), 15.6, 4.0,
           "cuda_ipc across processes with the production CudaIpc, vLLM's handle rebuild, and "
           "publish -> copied at Qwen2.5-0.5B's size next to one flat device copy"),
    # CPU: its --cpu run skips cuda_ipc (no CUDA); the same run over shm at the tiny shape, 10 s
    Check("publish-ipc-0.5b", "bench.weightsync",
          ("--shape", "qwen05b", "--device", "cuda", "--actor-device", "cuda", "--transport", "cuda_ipc"),
          ("--shape", "tiny", "--device", "cpu", "--actor-device", "cpu", "--transport", "cuda_ipc"),
          10, 4.5,
          "publish -> applied at Qwen2.5-0.5B's shape to a CUDA actor over cuda_ipc, against a "
          "device-to-device copy of the same bytes"),
    # CPU: tests/test_actors_static_decode.py (the static batch, eager) 25.5 s
    _tests("graph-tests", ("tests/test_actors_cuda.py",), 25.5, 1.8,
           "CUDA-graph decode: replays equal the eager static step, a swap shows in the next "
           "replay, buckets switch as rows finish"),
    # CPU: its --cpu run 8 s; 12x for generate's cold torch.compile (40-80 s expected)
    Check("decode-256", "bench.decode", ("--device", "cuda", "--shape", "qwen05b", "--slots", "256"),
          ("--cpu",), 8, 12.0,
          "hf engine decode tokens/s at 256 slots with CUDA graphs (and without) against "
          "model.generate with a static cache, uncompiled and compiled"),
    # CPU: tests/test_learner_packed_attention.py 10.2 s
    _tests("varlen-tests", ("tests/test_learner_packed_attention_cuda.py",), 10.2, 2.5,
           "varlen attention in bf16 equal to the mask path, the flash kernel really called"),
    # the second call. No CPU run: the last GPU run's 29 s (these passed there)
    _tests("learner-tests", ("tests/test_learner_cuda.py", "tests/test_weightsync_publisher.py"),
           29, 1.5, "the learner on CUDA started as the launcher starts it, and the publisher's "
           "GPU path"),
    # no CPU run (its CPU form is tests/test_bench_learner_memory.py's): the last GPU run took
    # 134 s for 3 rows, 50 s of it building DeepSpeedCPUAdam, which neither row list needs
    Check("learner-0.5b", "bench.learner_memory",
          ("--measure", "--device", "cuda", "--rows", "step", "--tokens", "16384", "--seconds", "5"),
          ("--help",), 90, 1.3,
          "the learner's peak memory, tokens/s and MFU at Qwen2.5-0.5B's shape and 16,384-token "
          "micro-batches, against a plain torch forward and backward and its own unchunked step"),
    Check("packing-0.5b", "bench.learner_memory",
          ("--measure", "--device", "cuda", "--rows", "packing", "--tokens", "16384", "--seconds", "5"),
          ("--help",), 70, 1.3,
          "the learner on a long tail of short samples packed several to a row: transformers' 4D "
          "mask against torch's variable-length flash attention"),
    # CPU: its --cpu run (tiny, shm) 10 s
    Check("publish-shm-0.5b", "bench.weightsync",
          ("--shape", "qwen05b", "--device", "cuda", "--actor-device", "cpu,cuda"),
          ("--shape", "tiny", "--device", "cpu", "--actor-device", "cpu"),
          10, 4.5,
          "publish -> applied over shm at Qwen2.5-0.5B's shape, to a CPU actor and to a CUDA actor"),
    # a third call: no CPU run (the system tests'); seed 0 at a 60 s cap, the loop then streamrl
    # with its start-up, ~170 s
    Check("longtail", "bench.longtail",
          ("--device", "cuda", "--seeds", "0", "--grid", "3e-4:0", "--cap-s", "60"),
          ("--help",), 170, 1.2,
          "the long-tail task on the GPU: the synchronous loop wholly on it against streamrl "
          "with its learner and actors on it"),
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


def _relay(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()


def run_check(check: Check, cpu: bool, timeout_s: float, echo=_relay) -> Result:
    """Run one check in a session of its own, its output handed line by line to ``echo`` as it
    comes; "ok", "failed (rc N)", "timeout (N s)" or "module missing". Nothing it started
    outlives it."""
    if not available(check):
        return Result(check.name, "module missing", 0.0, f"no module {check.module} in this tree")
    args = check.cpu_args if cpu else check.gpu_args
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    done = run_streamed([sys.executable, "-m", check.module, *args], ROOT, env, timeout_s, echo)
    if done.returncode is None:
        status = f"timeout ({timeout_s:.0f} s)"
    else:
        status = "ok" if done.returncode == 0 else f"failed (rc {done.returncode})"
    output = done.output
    if done.leftovers:
        output += f"[bench.gpu: {done.leftovers} processes of it still running, killed]\n"
    return Result(check.name, status, done.seconds, output)


def run_all(checks: list[Check], cpu: bool, budget_s: float, echo=_relay) -> list[Result]:
    deadline = time.monotonic() + budget_s
    results = []
    for check in checks:
        left = deadline - time.monotonic()
        if left <= 1:
            results.append(Result(check.name, "skipped (budget spent)", 0.0, ""))
            continue
        echo(f"== {check.name}: {check.what}\n")
        result = run_check(check, cpu, min(check.timeout_s, left), echo)
        echo(f"== {check.name}: {result.status} in {result.seconds:.0f} s\n")
        results.append(result)
    return results


def _driver() -> str:
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi"
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, timeout=20, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"nvidia-smi failed ({error})"
    return done.stdout.decode(errors="replace").strip() or f"nvidia-smi rc {done.returncode}"


def versions() -> str:
    """What the numbers depend on, one line: printed before any check runs."""
    import torch

    try:
        import transformers

        hf = transformers.__version__
    except ImportError:
        hf = "missing"
    cuda = torch.version.cuda or "none"
    return f"torch {torch.__version__} · transformers {hf} · CUDA {cuda} · driver {_driver()}"


def summary(results: list[Result], cpu: bool, header: str) -> str:
    from bench.__main__ import machine

    lines = [
        "## GPU check (`python -m bench.gpu`)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M')} · {machine()} · "
        f"{'CPU dry run (--cpu)' if cpu else 'GPU'} · {header}",
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


def _out_dir(parser: argparse.ArgumentParser, given: Path | None) -> Path | None:
    out = (
        given if given is not None else (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    )
    if out is not None and (ROOT / "docs") in (out.resolve(), *out.resolve().parents):
        parser.error("--out-dir: not under docs/ (the page there is written by hand)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="dry run on CPU at tiny shapes")
    parser.add_argument("--only", default=None, help="comma-separated check names, in this order")
    parser.add_argument("--budget-s", type=float, default=300.0, help="for all checks together")
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="summary.md and log.txt here (default: $OUT)"
    )
    args = parser.parse_args(argv)
    checks = list(CHECKS)
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {c.name for c in CHECKS})
        if unknown:
            parser.error(f"unknown checks {unknown}; known: {[c.name for c in CHECKS]}")
        checks = [next(c for c in CHECKS if c.name == name) for name in names]
    out = _out_dir(parser, args.out_dir)
    header = versions()
    print(header, flush=True)
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            parser.error("no CUDA device here: run with --cpu for the dry run")
    become_subreaper()
    log = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        log = (out / "log.txt").open("w", encoding="utf-8")
        log.write(header + "\n")

    def echo(line: str) -> None:
        _relay(line)
        if log is not None:
            log.write(line)
            log.flush()

    try:
        results = run_all(checks, args.cpu, args.budget_s, echo)
    finally:
        if log is not None:
            log.close()
    text = summary(results, args.cpu, header)
    print(text, flush=True)
    if out is not None:
        (out / "summary.md").write_text(text)
    return 0 if passed(results) else 1


if __name__ == "__main__":
    sys.exit(main())
