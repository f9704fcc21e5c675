"""What staleness alone costs the learning per sample: the reference loop at several lags, seed by seed.

    python -m bench.staleness --seeds 0,1,2,3,4 --lags 0,2 --max-rollouts 1000 --jobs 2 \\
        [dotted.key=value ...]

Every (seed, lag) is one run of ``bench.reference_loop`` with ``--lag``: each rollout sampled
with the weights of ``lag`` optimizer steps earlier and trained with streamrl's decoupled
objective, no system around it. The demo preset's look-ahead of one batch is lag 2 (two
mini-batches, so two versions, per batch; the learner's step rows show a staleness of 2.0).
The measure is rollouts to the preset's target, not time: with one torch thread a run is
deterministic for its seed, so the runs may share the cores (``--jobs``) and give the same
counts on any machine with the same torch. Writes docs/bench/staleness.md.
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from bench.cli import command_line, publish

SECTION = Path("docs/bench/staleness.md")
# a generous wall-clock bound per run; the rollout cap is the one that counts
MAX_TIME_S = 3600.0


def _one(seed: int, lag: int, max_rollouts: int, workdir: str, overrides: list[str]) -> dict:
    from bench.reference_loop import run_reference

    result = run_reference(
        seed,
        MAX_TIME_S,
        workdir,
        overrides,
        lag=lag,
        max_rollouts=max_rollouts,
        echo=lambda line: None,
    )
    last_reward, last_exact = result["last_window"]
    return {
        "seed": seed,
        "lag": lag,
        "rollouts_to_target": result["rollouts_to_target"],
        "rollouts": result["steps"],
        "last_reward": last_reward,
        "last_exact": last_exact,
    }


def run_grid(
    seeds: list[int], lags: list[int], max_rollouts: int, jobs: int, overrides: list[str], root
) -> list[dict]:
    """Every (seed, lag) run; each seed's warmed policy and prompts built once, before the runs."""
    from streamrl.examples.reverse_digits.assets import build_policy, write_dataset

    for seed in seeds:
        write_dataset(Path(root) / f"seed{seed}" / "data" / "train.jsonl", seed=seed)
        build_policy(Path(root) / f"seed{seed}" / "policy", seed=seed)
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        futures = [
            pool.submit(_one, seed, lag, max_rollouts, str(Path(root) / f"seed{seed}"), overrides)
            for seed in seeds
            for lag in lags
        ]
        results = []
        for future in futures:
            result = future.result()
            print(
                f"seed {result['seed']} lag {result['lag']}: "
                f"{result['rollouts_to_target'] or 'missed'} rollouts to target",
                flush=True,
            )
            results.append(result)
    return results


def median_rollouts(results: list[dict], lag: int) -> float:
    """Median rollouts to target at one lag; a miss counts as infinitely many."""
    counts = [r["rollouts_to_target"] or math.inf for r in results if r["lag"] == lag]
    return statistics.median(counts)


def _median_cell(median: float) -> str:
    return "missed on half the seeds or more" if math.isinf(median) else f"{median:g}"


def section(results: list[dict], lags: list[int], max_rollouts: int, command: str) -> str:
    from bench.system import machine

    seeds = sorted({r["seed"] for r in results})
    by_key = {(r["seed"], r["lag"]): r for r in results}

    def cell(r: dict) -> str:
        if r["rollouts_to_target"]:
            return str(r["rollouts_to_target"])
        return f"not in {max_rollouts} ({r['last_reward']:.2f} / {r['last_exact']:.2f})"

    def ratio(lag: int) -> str:
        num, den = median_rollouts(results, lag), median_rollouts(results, lags[0])
        return "n/a" if math.isinf(num) or math.isinf(den) else f"{num / den:.2f}×"

    return "\n".join(
        [
            "## Staleness alone: the reference loop sampling with older weights",
            "",
            f"{datetime.date.today()} · {machine()} · `{command}`",
            "",
            "Rollouts (256 completions each) to the preset's target (20-rollout means of reward "
            "≥ 0.95 and exact match ≥ 0.85) when every rollout is sampled with the weights of "
            "*lag* optimizer steps earlier; a run that missed it shows the reward / exact match "
            "of its last 20 rollouts. The preset's look-ahead is lag 2.",
            "",
            "| seed | " + " | ".join(f"lag {lag}" for lag in lags) + " |",
            "|---|" + "---|" * len(lags),
            *(
                f"| {seed} | " + " | ".join(cell(by_key[seed, lag]) for lag in lags) + " |"
                for seed in seeds
            ),
            "| median | "
            + " | ".join(_median_cell(median_rollouts(results, lag)) for lag in lags)
            + " |",
            f"| median / lag {lags[0]} | " + " | ".join(ratio(lag) for lag in lags) + " |",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds")
    parser.add_argument(
        "--lags", default="0,2", help="comma-separated lags, the first the baseline"
    )
    parser.add_argument("--max-rollouts", type=int, default=1000, help="rollout cap of one run")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (one core each)")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value on configs/demo_cpu.yaml")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    lags = [int(s) for s in args.lags.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-staleness-") as root:
        results = run_grid(seeds, lags, args.max_rollouts, args.jobs, args.overrides, root)
    command = command_line("bench.staleness", argv)
    publish(SECTION, section(results, lags, args.max_rollouts, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
