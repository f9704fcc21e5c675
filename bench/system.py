"""System benchmarks: streamrl async vs synchronous vs TRL, a staleness sweep, and where time goes.

    python -m bench.system [--quick] [--seeds 0,1,2] [--only ttt,sweep,time]

Every streamrl run is the real system of ``make run`` (``launch.supervisor``:
embedded Redis, DeepSpeed learner, actor processes) on the CPU demo config,
changed only by ``run.*`` overrides, the shared policy/data paths and what a
variant needs. Wall time counts from the launch; the warmed demo policy is
built once per seed beforehand (shared with TRL), so no side pays for it.

1. ``ttt``: time to target (5-step means of reward >= 0.9 and exact match >= 0.8)
   for streamrl async (learner + 2 actors), streamrl synchronous
   (``algo.max_staleness=0``, 1 actor) and TRL's GRPOTrainer.
2. ``sweep``: reward curves for several ``algo.max_staleness`` values, with and
   without the importance correction.
3. ``time``: the share of wall time each process spends per phase, from
   Prometheus counters scraped from every process of one async run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

CONFIG = "configs/demo_cpu.yaml"
ROOT = Path("runs/bench-system")
IMG_DIR = Path("docs/img")
SECTION = Path("docs/bench/system.md")
TARGET_REWARD, TARGET_EXACT, WINDOW = 0.9, 0.8, 5
# A bar every system clears on this task, so the three are compared even in runs that miss the target.
MILESTONE_REWARD = 0.7
STOP_GRACE_S = 45.0  # the learner stops itself at max_time_s after its own start-up; past cap + grace the bench stops the run
SCRAPE_EVERY_S = 10.0
POLL_S = 1.0
SCRAPE_TIMEOUT_S = 2.0
PARTS = ("ttt", "sweep", "time")

# label, extra overrides; the demo config's own max_staleness is 1
SWEEP = [
    ("S=0", ["algo.max_staleness=0"]),
    ("S=1", ["algo.max_staleness=1"]),
    ("S=2", ["algo.max_staleness=2"]),
    ("S=4", ["algo.max_staleness=4"]),
    ("S=8", ["algo.max_staleness=8"]),
    ("S=4, no IS", ["algo.max_staleness=4", "algo.importance_correction=false"]),
    ("S=8, no IS", ["algo.max_staleness=8", "algo.importance_correction=false"]),
]


@dataclass(frozen=True)
class Settings:
    seeds: tuple[int, ...]
    ttt_cap_s: float
    sweep_cap_s: float
    reuse: bool = False  # read runs saved under ROOT/outcomes instead of running them again


QUICK = Settings(seeds=(0,), ttt_cap_s=180.0, sweep_cap_s=90.0)
FULL = Settings(seeds=(0, 1, 2), ttt_cap_s=240.0, sweep_cap_s=180.0)


# ----- Prometheus text -> numbers (pure) ------------------------------------------------------


def sample_key(name: str, labels: dict[str, str]) -> str:
    """``name{a="x",b="y"}`` with sorted labels, or ``name`` alone."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def flatten_metrics(text: str) -> dict[str, float]:
    """Every sample of a /metrics page, keyed by ``sample_key``."""
    return {
        sample_key(s.name, s.labels): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


ACTOR_PHASES = {
    "generating": "streamrl_actor_generate_seconds_total",
    "admission wait": "streamrl_actor_admission_wait_seconds_total",
    "weight swap": "streamrl_actor_weight_swap_seconds_sum",
}
LEARNER_PHASES = {
    name: sample_key("streamrl_learner_step_phase_seconds_sum", {"phase": phase})
    for name, phase in [
        ("forward/backward", "forward_backward"),
        ("optimizer", "optimizer"),
        ("waiting for data", "wait"),
        ("publish", "publish"),
        ("checkpoint", "checkpoint"),
    ]
}
BACKGROUND = {"weights receive (background thread)": "streamrl_weights_receive_seconds_sum"}


def _delta(before: dict[str, float], after: dict[str, float], key: str) -> float:
    return max(0.0, after.get(key, 0.0) - before.get(key, 0.0))


def time_shares(
    role: str, before: dict[str, float], after: dict[str, float], window_s: float
) -> dict[str, float]:
    """Fraction of ``window_s`` a process spent in each phase between two scrapes; ``other`` is the rest.

    Actors swap weights between two decode steps, i.e. inside ``generate``, so
    the swap time is taken out of ``generating`` to keep the shares disjoint.
    """
    if window_s <= 0:
        raise ValueError(f"window must be positive, got {window_s}")
    phases = ACTOR_PHASES if role == "actor" else LEARNER_PHASES
    shares = {name: _delta(before, after, key) / window_s for name, key in phases.items()}
    if role == "actor":
        shares["generating"] = max(0.0, shares["generating"] - shares["weight swap"])
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


@dataclass
class Scrape:
    at: float  # time.monotonic()
    by_target: dict[str, dict[str, float]]  # "role:ident" -> flattened metrics


def breakdown(
    scrapes: list[Scrape],
) -> tuple[float, dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Shares per process between the first scrape where the learner has trained and every
    process answers, and the last scrape where the learner still answers.

    Returns (window seconds, {target: shares}, {target: background shares}).
    """
    steady = [
        s
        for s in scrapes
        if s.by_target.get("learner:0", {}).get("streamrl_learner_steps_total", 0) >= 1
        and any(t.startswith("actor:") for t in s.by_target)
    ]
    if len(steady) < 2:
        raise ValueError("need two scrapes after the learner's first step to compute time shares")
    first, last = steady[0], steady[-1]
    window = last.at - first.at
    shares, background = {}, {}
    for target in sorted(set(first.by_target) & set(last.by_target)):
        role = target.split(":", 1)[0]
        if role not in ("actor", "learner"):
            continue
        before, after = first.by_target[target], last.by_target[target]
        shares[target] = time_shares(role, before, after, window)
        if role == "actor":
            background[target] = {
                n: _delta(before, after, k) / window for n, k in BACKGROUND.items()
            }
    return window, shares, background


def scrape_all(redis, keys) -> Scrape:
    """One /metrics read of every process registered in ``metrics:targets`` (unreachable ones skipped)."""
    at = time.monotonic()
    by_target = {}
    for target, addr in redis.hgetall(keys.metrics_targets).items():
        target = target.decode() if isinstance(target, bytes) else target
        addr = addr.decode() if isinstance(addr, bytes) else addr
        try:
            with urllib.request.urlopen(f"http://{addr}/metrics", timeout=SCRAPE_TIMEOUT_S) as resp:
                by_target[target] = flatten_metrics(resp.read().decode())
        except OSError:  # a process between restarts or shutting down
            continue
    return Scrape(at, by_target)


# ----- one run -------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One training run, whichever system: the per-step curve and its throughput."""

    system: str
    seed: int
    cap_s: float
    curve: list[
        tuple[float, float, float]
    ]  # (seconds since launch, reward mean, exact match) per step
    samples_per_s: float
    tokens_per_s: float
    wall_s: float
    extra: dict = field(default_factory=dict)
    scrapes: list[Scrape] = field(default_factory=list)

    def time_to(self, reward: float, exact: float = 0.0) -> float | None:
        """Seconds since launch at the end of the first ``WINDOW`` steps whose means reach both bars."""
        for end in range(WINDOW, len(self.curve) + 1):
            recent = self.curve[end - WINDOW : end]
            if (
                statistics.fmean(r for _, r, _ in recent) >= reward
                and statistics.fmean(e for _, _, e in recent) >= exact
            ):
                return recent[-1][0]
        return None

    @property
    def time_to_target_s(self) -> float | None:
        return self.time_to(TARGET_REWARD, TARGET_EXACT)

    @property
    def time_to_milestone_s(self) -> float | None:
        return self.time_to(MILESTONE_REWARD)

    @property
    def reached(self) -> tuple[float, float]:
        """Reward and exact match, means of the last ``WINDOW`` steps."""
        recent = self.curve[-WINDOW:]
        if not recent:
            return math.nan, math.nan
        return statistics.fmean(r for _, r, _ in recent), statistics.fmean(e for _, _, e in recent)


def seed_inputs(seed: int) -> tuple[Path, Path]:
    """The warmed policy and the prompts of one seed, built once and shared by streamrl and TRL."""
    from actors.demo_task import ensure_demo_dataset, ensure_demo_policy

    folder = ROOT / f"seed{seed}"
    # TRL's run_trl looks for <workdir>/policy and <workdir>/data/train.jsonl: the same files.
    return ensure_demo_policy(folder / "policy", seed=seed), ensure_demo_dataset(
        folder / "data" / "train.jsonl", seed=seed
    )


def saved_path(name: str, cap_s: float) -> Path:
    return ROOT / "outcomes" / f"{name}-cap{cap_s:g}.json"


def save_outcome(outcome: Outcome, path: Path) -> None:
    """Every finished run is kept, so a later failure (a plot, a table) never costs the runs again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(outcome)))
    os.replace(tmp, path)


def load_outcome(path: Path) -> Outcome:
    data = json.loads(path.read_text())
    data["curve"] = [tuple(p) for p in data["curve"]]
    data["scrapes"] = [Scrape(**s) for s in data["scrapes"]]
    return Outcome(**data)


def run_streamrl(
    system: str,
    seed: int,
    extra: list[str],
    actors: int,
    cap_s: float,
    stop_at_target: bool,
    reuse: bool = False,
) -> Outcome:
    """Launch the system, poll it, scrape every process, stop at the target or the cap."""
    name = f"bench-{system.replace(' ', '').replace(',', '-').replace('=', '')}-s{seed}".lower()
    saved = saved_path(name, cap_s)
    if reuse and saved.exists():
        print(f"   {system} seed {seed}: reusing {saved}", flush=True)
        return load_outcome(saved)
    outcome = _launch_and_watch(system, name, seed, extra, actors, cap_s, stop_at_target)
    save_outcome(outcome, saved)
    return outcome


def _launch_and_watch(
    system: str,
    name: str,
    seed: int,
    extra: list[str],
    actors: int,
    cap_s: float,
    stop_at_target: bool,
) -> Outcome:
    from configs import load_config
    from launch.status import read_steps, time_to_target
    from launch.supervisor import Supervisor

    policy, data = seed_inputs(seed)
    overrides = [
        f"run.seed={seed}",
        f"run.name={name}",
        f"run.dir={ROOT / name}",
        f"run.max_time_s={cap_s:g}",
        f"model.path={policy}",
        f"data.path={data}",
        *extra,
    ]
    cfg = load_config(CONFIG, overrides, env={})
    sup = Supervisor(cfg, CONFIG, overrides, actors=actors)
    scrapes: list[Scrape] = []
    started, started_unix = time.monotonic(), time.time()
    last_scrape = started
    print(
        f"   {system} seed {seed}: {' '.join(extra) or 'demo config'}, {actors} actor(s), cap {cap_s:g} s",
        flush=True,
    )
    try:
        sup.start()
        while not sup.learner_finished and time.monotonic() - started < cap_s + STOP_GRACE_S:
            sup.tick()
            if time.monotonic() - last_scrape >= SCRAPE_EVERY_S:
                last_scrape = time.monotonic()
                scrapes.append(scrape_all(sup.redis, sup.keys))
            steps = read_steps(sup.run_dir) if stop_at_target else []
            if (
                stop_at_target
                and time_to_target(steps, started_unix, TARGET_REWARD, TARGET_EXACT) is not None
            ):
                scrapes.append(scrape_all(sup.redis, sup.keys))
                break
            time.sleep(POLL_S)
    finally:
        sup.stop()
    wall_s = time.monotonic() - started
    # The learner's own clock starts after its start-up: steps past the cap (from the launch) do not count.
    steps = [s for s in read_steps(sup.run_dir) if s["time"] - started_unix <= cap_s]
    group_size = cfg.rollout.group_size
    curve = [(s["time"] - started_unix, s["reward_mean"], s["exact_match"]) for s in steps]
    loop_s = steps[-1]["time"] - steps[0]["time"] if len(steps) > 1 else 0.0
    # Steady-state loop, start-up excluded (as TRL's samples/s): completions the learner took after its first step.
    samples_per_s = sum(s["groups"] * group_size for s in steps[1:]) / loop_s if loop_s > 0 else 0.0
    print(f"   -> {len(steps)} steps in {wall_s:.0f} s", flush=True)
    return Outcome(
        system,
        seed,
        cap_s,
        curve,
        samples_per_s,
        generated_tokens_per_s(scrapes),
        wall_s,
        extra={
            "steps": steps,
            "updates_per_batch": cfg.learner.updates_per_batch,
            "max_staleness": cfg.algo.max_staleness,
            "groups_per_step": cfg.learner.groups_per_step,
            "overrides": extra,
            "actors": actors,
        },
        scrapes=scrapes,
    )


def generated_tokens_per_s(scrapes: list[Scrape]) -> float:
    """Completion tokens all actors generated per second, between the first and last scrape that saw actors."""
    seen = [s for s in scrapes if any(t.startswith("actor:") for t in s.by_target)]
    if len(seen) < 2 or seen[-1].at <= seen[0].at:
        return 0.0
    first, last = seen[0], seen[-1]
    key = "streamrl_actor_tokens_generated_total"
    tokens = sum(
        _delta(first.by_target[t], last.by_target[t], key)
        for t in first.by_target
        if t.startswith("actor:") and t in last.by_target
    )
    return tokens / (last.at - first.at)


def run_trl_outcome(seed: int, cap_s: float, reuse: bool = False) -> Outcome:
    saved = saved_path(f"trl-s{seed}", cap_s)
    if reuse and saved.exists():
        print(f"   TRL seed {seed}: reusing {saved}", flush=True)
        return load_outcome(saved)
    outcome = _run_trl(seed, cap_s)
    save_outcome(outcome, saved)
    return outcome


def _run_trl(seed: int, cap_s: float) -> Outcome:
    from bench.trl_baseline import run_trl

    seed_inputs(seed)
    print(f"   TRL seed {seed}: cap {cap_s:g} s", flush=True)
    started = time.monotonic()
    result = run_trl(seed, cap_s, ROOT / f"seed{seed}", stop_at_target=True)
    wall_s = time.monotonic() - started
    print(f"   -> {result['steps']} steps in {wall_s:.0f} s", flush=True)
    return Outcome(
        "TRL GRPOTrainer",
        seed,
        cap_s,
        [tuple(p) for p in result["curve"]],
        result["samples_per_s"],
        result["tokens_per_s"],
        wall_s,
        extra={"setup_s": result["setup_s"]},
    )


# ----- 1. time to target ---------------------------------------------------------------------

ASYNC, SYNC, TRL = "streamrl async", "streamrl sync", "TRL GRPOTrainer"


def run_time_to_target(settings: Settings) -> dict[str, list[Outcome]]:
    results: dict[str, list[Outcome]] = {ASYNC: [], SYNC: [], TRL: []}
    for seed in settings.seeds:
        results[ASYNC].append(
            run_streamrl(ASYNC, seed, [], 2, settings.ttt_cap_s, True, settings.reuse)
        )
        results[SYNC].append(
            run_streamrl(
                SYNC, seed, ["algo.max_staleness=0"], 1, settings.ttt_cap_s, True, settings.reuse
            )
        )
        results[TRL].append(run_trl_outcome(seed, settings.ttt_cap_s, settings.reuse))
    return results


def median_ttt(outcomes: list[Outcome], milestone: bool = False) -> float:
    """Median time to the target (or the milestone); a run that missed it counts as infinitely slow."""
    times = (o.time_to_milestone_s if milestone else o.time_to_target_s for o in outcomes)
    return statistics.median(t if t is not None else math.inf for t in times)


def ratio_text(num: list[Outcome], den: list[Outcome], goal: float, milestone: bool = False) -> str:
    bar = "the milestone" if milestone else "the target"
    a, b = median_ttt(num, milestone), median_ttt(den, milestone)
    if math.isinf(a):
        return f"n/a (async did not reach {bar})"
    if math.isinf(b):
        bound = a / max(o.cap_s for o in den)
        return f"< {bound:.2f}× (the baseline missed {bar} within its cap) — goal ≤ {goal}×: {'met' if bound <= goal else 'not shown'}"
    ratio = a / b
    return f"**{ratio:.2f}×** — goal ≤ {goal}×: {'met' if ratio <= goal else 'not met'}"


def _ttt_cell(o: Outcome) -> str:
    ttt = o.time_to_target_s
    if ttt is not None:
        return f"{ttt:.0f} s"
    reward, exact = o.reached
    return f"not in {o.cap_s:.0f} s (reached {reward:.3f} / {exact:.2f})"


def _stale_cell(outcomes: list[Outcome]) -> str:
    steps = [s for o in outcomes for s in o.extra.get("steps", [])]
    if not steps:
        return "–"
    dropped = sum(s.get("dropped_stale_groups", 0) for s in steps)
    staleness = statistics.fmean(s["staleness_mean"] for s in steps)
    return f"{dropped} of {sum(s['groups'] for s in steps)} groups; {staleness:.2f}"


def ttt_markdown(results: dict[str, list[Outcome]], settings: Settings) -> str:
    rows = []
    for system, outcomes in results.items():
        times = [o.time_to_target_s for o in outcomes if o.time_to_target_s is not None]
        med = median_ttt(outcomes)
        spread = (
            f"{min(times):.0f}–{max(times):.0f} s ({len(times)}/{len(outcomes)} reached)"
            if times
            else "–"
        )
        milestone = median_ttt(outcomes, milestone=True)
        rows.append(
            f"| {system} | {'∞' if math.isinf(med) else f'{med:.0f} s'} | {spread} | "
            f"{'∞' if math.isinf(milestone) else f'{milestone:.0f} s'} | "
            + "; ".join(f"s{o.seed}: {_ttt_cell(o)}" for o in outcomes)
            + f" | {statistics.fmean(o.samples_per_s for o in outcomes):.0f}"
            + f" | {statistics.fmean(o.tokens_per_s for o in outcomes):.0f} | {_stale_cell(outcomes)} |"
        )
    streamrl = results[ASYNC][0].extra
    return "\n".join(
        [
            "### Time to target on the CPU demo task",
            "",
            f"Target: {WINDOW}-step means of reward ≥ {TARGET_REWARD} and exact match ≥ {TARGET_EXACT}. "
            f"Seeds {', '.join(map(str, settings.seeds))}; cap {settings.ttt_cap_s:.0f} s per run, each run stops at the target. "
            "Wall time from the launch (Redis, learner and actor start-up included; for TRL its model load and trainer "
            "set-up); the warmed demo policy is built beforehand, once per seed, and shared by all three.",
            "",
            f"- **streamrl async**: `{CONFIG}` as is (max_staleness {streamrl['max_staleness']}, "
            f"updates_per_batch {streamrl['updates_per_batch']}), learner + 2 actors.",
            "- **streamrl sync**: the same code with `algo.max_staleness=0` and 1 actor. The actor starts a group "
            "only on the learner's newest weights and the learner trains only tokens sampled with its current "
            "version (older tokens masked, wholly stale groups dropped), so the useful work alternates: what the "
            "actor samples while the learner trains comes from the previous version and is masked or dropped "
            "(last column).",
            "- **TRL GRPOTrainer**: `bench.trl_baseline.run_trl` (same policy, prompts, reward and hyper-parameters; "
            "generate-then-train in one process).",
            "",
            "| system | median time to target | spread | median time to reward ≥ "
            f"{MILESTONE_REWARD} | per seed (reward / exact reached when missed) "
            "| samples/s | tokens/s | stale groups dropped; mean staleness (versions) |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"- async / sync, time to target: {ratio_text(results[ASYNC], results[SYNC], 0.6)}",
            f"- async / TRL, time to target: {ratio_text(results[ASYNC], results[TRL], 0.5)}",
            f"- async / sync, time to reward ≥ {MILESTONE_REWARD}: "
            f"{ratio_text(results[ASYNC], results[SYNC], 0.6, milestone=True)}",
            f"- async / TRL, time to reward ≥ {MILESTONE_REWARD}: "
            f"{ratio_text(results[ASYNC], results[TRL], 0.5, milestone=True)}",
            "",
            "samples/s: completions per second of the training loop, start-up excluded (streamrl: completions the "
            "learner consumed between its first and last step; TRL: completions generated in its loop). tokens/s: "
            "completion tokens generated per second (streamrl: all actors, from their Prometheus counters; TRL: its loop).",
        ]
    )


# ----- 2. staleness sweep --------------------------------------------------------------------


def run_sweep(settings: Settings) -> list[tuple[str, Outcome]]:
    seed = settings.seeds[0]
    return [
        (
            label,
            run_streamrl(
                f"sweep {label}", seed, extra, 2, settings.sweep_cap_s, False, settings.reuse
            ),
        )
        for label, extra in SWEEP
    ]


def rolling_mean(values: list[float], window: int = WINDOW) -> list[float]:
    """Mean of the last ``window`` values at each position (fewer at the start)."""
    return [statistics.fmean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]


def plot_sweep(sweep: list[tuple[str, Outcome]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    colors = {}
    for label, o in sweep:
        if not o.curve:
            continue
        base = label.split(",")[0]
        color = colors.setdefault(base, f"C{len(colors)}")
        style = "--" if "no IS" in label else "-"
        reward = rolling_mean([r for _, r, _ in o.curve])
        by_time.plot([t for t, _, _ in o.curve], reward, style, color=color, label=label)
        by_step.plot(range(1, len(reward) + 1), reward, style, color=color, label=label)
    by_time.set_xlabel("wall time since launch (s)")
    by_step.set_xlabel("learner step")
    by_time.set_ylabel(f"reward ({WINDOW}-step mean)")
    for ax in (by_time, by_step):
        ax.axhline(TARGET_REWARD, color="grey", lw=0.8, ls=":")
        ax.grid(alpha=0.3)
    by_step.legend(
        title="max_staleness\n(dashed: no IS correction)",
        fontsize=8,
        loc="center left",
        bbox_to_anchor=(1.02, 0.5),
    )
    fig.suptitle("streamrl staleness sweep, CPU demo task, learner + 2 actors")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def sweep_markdown(sweep: list[tuple[str, Outcome]], settings: Settings) -> str:
    plot_sweep(sweep, IMG_DIR / "staleness_sweep.png")
    upb = sweep[0][1].extra["updates_per_batch"]
    rows = []
    for label, o in sweep:
        steps = o.extra["steps"]
        reward, exact = o.reached
        stale = statistics.fmean(s["staleness_mean"] for s in steps) if steps else math.nan
        dropped = sum(s.get("dropped_stale_groups", 0) for s in steps)
        ttt = o.time_to_target_s
        rows.append(
            f"| {label} | {o.extra['max_staleness'] // upb} | {len(steps)} | {reward:.3f} / {exact:.2f} | "
            f"{'–' if ttt is None else f'{ttt:.0f} s'} | {stale:.2f} | {dropped} | {o.samples_per_s:.0f} |"
        )
    return "\n".join(
        [
            "### Staleness sweep",
            "",
            f"Seed {settings.seeds[0]}, learner + 2 actors, {settings.sweep_cap_s:.0f} s per run (no early stop), demo config "
            'with only `algo.max_staleness` (and `algo.importance_correction=false` for the "no IS" runs) changed. '
            f"`learner.updates_per_batch` = {upb} in the demo config: admission counts batches, so actors may run "
            f"`max_staleness // updates_per_batch` batches ahead (the lookahead column); with {upb} update(s) per batch "
            f"each batch advances the version by {upb}.",
            "",
            "One run per setting: gaps between neighbouring settings of the size seen between the three "
            "async seeds above are run-to-run spread, not an effect of the setting.",
            "",
            "![reward vs wall time and vs step for each max_staleness](img/staleness_sweep.png)",
            "",
            f"| setting | lookahead (batches) | steps | last {WINDOW} steps reward / exact | time to target | mean staleness (versions) | stale groups dropped | samples/s |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )


# ----- 3. where time goes --------------------------------------------------------------------

PHASE_ORDER = [
    "generating",
    "admission wait",
    "weight swap",
    "forward/backward",
    "optimizer",
    "waiting for data",
    "publish",
    "checkpoint",
    "other",
]


def plot_breakdown(shares: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = sorted(shares, key=lambda t: (not t.startswith("learner"), t))
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.7 * len(targets)))
    left = [0.0] * len(targets)
    for i, phase in enumerate(PHASE_ORDER):
        widths = [shares[t].get(phase, 0.0) for t in targets]
        if not any(widths):
            continue
        color = "lightgrey" if phase == "other" else f"C{i}"
        ax.barh(targets, widths, left=left, color=color, label=phase)
        for y, (x0, w) in enumerate(zip(left, widths, strict=True)):
            if w >= 0.06:
                ax.text(x0 + w / 2, y, f"{w:.0%}", ha="center", va="center", fontsize=8)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("share of wall time")
    ax.legend(
        ncol=5,
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35 if len(targets) < 4 else -0.2),
    )
    ax.set_title("Where time goes: one async run (learner + 2 actors), CPU demo task")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def time_markdown(outcome: Outcome) -> str:
    window, shares, background = breakdown(outcome.scrapes)
    plot_breakdown(shares, IMG_DIR / "time_breakdown.png")
    columns = [
        p for p in PHASE_ORDER if any(s.get(p, 0.0) > 0 for s in shares.values()) or p == "other"
    ]
    rows = []
    for target in sorted(shares, key=lambda t: (not t.startswith("learner"), t)):
        cells = [f"{shares[target][p]:.1%}" if p in shares[target] else "–" for p in columns]
        bg = background.get(target)
        receive = f"{sum(bg.values()):.1%}" if bg else "–"
        rows.append(f"| {target} | " + " | ".join(cells) + f" | {receive} |")
    return "\n".join(
        [
            "### Where time goes",
            "",
            f"One async run (seed {outcome.seed}): every process's `/metrics` (targets from Redis "
            f"`metrics:targets`) scraped every {SCRAPE_EVERY_S:.0f} s; shares are counter increases over the "
            f"{window:.0f} s between the first scrape after the learner's first step and the last scrape before the "
            "run ended, divided by that window. Actors: `streamrl_actor_generate_seconds_total` (weight swaps, "
            "which happen between decode steps, taken out), `streamrl_actor_admission_wait_seconds_total`, "
            "`streamrl_actor_weight_swap_seconds`; learner: `streamrl_learner_step_phase_seconds{phase}`. "
            "`other` is the rest (actors: scoring and XADD; learner: the frozen reference model's no-grad pass for the KL term, batch preparation, acks, logging). The weights "
            "receive time runs in the subscriber's background thread, overlapping generation, so it is listed apart.",
            "",
            "![stacked share of wall time per process](img/time_breakdown.png)",
            "",
            "| process | " + " | ".join(columns) + " | weights receive (background) |",
            "|---|" + "---|" * (len(columns) + 1),
            *rows,
        ]
    )


# ----- the section ---------------------------------------------------------------------------


def machine() -> str:
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.node()}: {os.cpu_count()} cores, {mem_gib:.0f} GiB, {platform.machine()}, Python {platform.python_version()}"


def run(
    quick: bool = False,
    seeds: tuple[int, ...] | None = None,
    only: tuple[str, ...] = PARTS,
    command: str | None = None,
    reuse: bool = False,
) -> str:
    """The Markdown section of the system benchmarks."""
    import torch

    torch.set_num_threads(1)
    unknown = set(only) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    settings = QUICK if quick else FULL
    settings = replace(settings, seeds=tuple(seeds) if seeds else settings.seeds, reuse=reuse)
    command = command or "make bench" + (" --quick" if quick else "")
    started = time.monotonic()
    body = []
    async_run = None
    if "ttt" in only:
        print("== time to target", flush=True)
        results = run_time_to_target(settings)
        async_run = results[ASYNC][0]
        body.append(ttt_markdown(results, settings))
    if "sweep" in only:
        print("== staleness sweep", flush=True)
        body.append(sweep_markdown(run_sweep(settings), settings))
    if "time" in only:
        print("== where time goes", flush=True)
        if async_run is None:
            async_run = run_streamrl(
                ASYNC, settings.seeds[0], [], 2, settings.ttt_cap_s, True, settings.reuse
            )
        try:
            body.append(time_markdown(async_run))
        except ValueError as exc:  # e.g. a run that hit the target before two scrapes
            body.append(f"### Where time goes\n\nNot measured in this run: {exc}.")
    header = [
        "## System: async vs synchronous vs TRL, staleness, where time goes",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC · {machine()} · "
        f"`{command}` ({'quick: ' if quick else ''}took {(time.monotonic() - started) / 60:.0f} min"
        + (
            f", reading the runs that earlier invocations saved under {ROOT}/outcomes"
            if reuse
            else ""
        )
        + "; "
        "this machine's 2 cores run every process of a run, shared with whatever else runs). "
        "Ratios compare runs made back to back on this machine; they are reported, not asserted.",
        "",
    ]
    return "\n".join(header) + "\n\n".join(body) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="1 seed, shorter caps (about 25 minutes)"
    )
    parser.add_argument(
        "--seeds", default=None, help="comma-separated seeds (default 0,1,2; quick: 0)"
    )
    parser.add_argument(
        "--only", default=",".join(PARTS), help=f"comma-separated parts of {','.join(PARTS)}"
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help=f"read runs already saved under {ROOT}/outcomes instead of running them again",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else None
    command = "python -m bench.system " + " ".join(argv if argv is not None else sys.argv[1:])
    only = tuple(p for p in args.only.split(",") if p)
    section = run(args.quick, seeds, only, command.strip(), args.reuse)
    SECTION.parent.mkdir(parents=True, exist_ok=True)
    SECTION.write_text(section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
