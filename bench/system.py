"""System benchmarks: streamrl async vs synchronous vs a plain loop vs TRL, and where time goes.

    python -m bench.system [--quick] [--seeds 0,1,2,3,4] [--tune-seeds 0,1] [--only ttt,time]

Every streamrl run is the real system of ``make run`` (``launch.supervisor``:
embedded Redis, DeepSpeed learner, actor processes) on the CPU demo config,
changed only by ``run.*`` overrides, the shared policy/data paths and what a
variant needs. Wall time counts from the launch; the warmed demo policy is
built once per seed beforehand (warm-start seed = RL seed, shared by every
system), so no side pays for it.

1. ``ttt``: time to the preset's target (``run.target_*``: 20-step means of
   reward >= 0.95 and exact match >= 0.85) for streamrl async (learner + 2
   actors), streamrl synchronous (``algo.max_staleness=0``, 1 actor), the
   one-process reference loop (``bench.reference_loop``) and TRL's
   GRPOTrainer, each at its own best point of the same grid (lr x KL
   coefficient), chosen on the tune seeds; then every system at its best on
   every seed, the systems interleaved per seed so ratios are back to back.
   The full run is 2 tune seeds x 4 points x 4 systems + 3 more seeds x 4
   systems = 44 runs of up to ``--cap-s`` (600 s) each: give it an otherwise
   idle machine. ``--quick`` is a smoke run: seed 0, the preset's point only.
2. ``time``: the share of wall time each process spends per phase, from
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

from bench.cli import command_line, publish
from bench.tasks import DEMO, Task
from streamrl.examples.reverse_digits.rewards import EXACT_PART
from streamrl.learner import target as run_target

CONFIG = "configs/demo_cpu.yaml"
ROOT = Path("runs/bench-system")
IMG_DIR = Path("docs/img")
SECTION = Path("docs/bench/system.md")
# A bar every system clears on this task, so the systems are compared even in runs that miss the target.
MILESTONE_REWARD = 0.7
# (lr, k3 KL coefficient): the grid every system is tuned on (issue 11)
GRID = tuple((lr, kl) for lr in (3e-4, 6e-4) for kl in (0.0, 0.1))
# in run_loop_outcome's extra: the reference loop keeps the warm start's AdamW (reference_loop --carry-optimizer)
CARRY = "carry-optimizer"
# the learner stops itself at max_time_s after its own start-up; past cap + grace the bench stops the run
STOP_GRACE_S = 45.0
SCRAPE_EVERY_S = 10.0
POLL_S = 1.0
SCRAPE_TIMEOUT_S = 2.0
PARTS = ("ttt", "time")


def demo_target() -> tuple[float, float, int]:
    """(reward, exact, window) of the preset's ``run.target_*``, the one definition of the target."""
    from streamrl.configs import load_config

    run = load_config(CONFIG, [], env={}).run
    return run.target_reward, run.target_parts.get(EXACT_PART, 0.0), run.target_window


TARGET_REWARD, TARGET_EXACT, WINDOW = demo_target()
TARGET_BARS = {run_target.REWARD: TARGET_REWARD, EXACT_PART: TARGET_EXACT}


def preset_point() -> tuple[float, float]:
    from streamrl.configs import load_config

    cfg = load_config(CONFIG, [], env={})
    return cfg.learner.lr, cfg.algo.kl_coef


def point_overrides(point: tuple[float, float]) -> list[str]:
    lr, kl = point
    return [f"learner.lr={lr:g}", f"algo.kl_coef={kl:g}"]


def point_label(point: tuple[float, float]) -> str:
    return f"lr {point[0]:g}, KL {point[1]:g}"


@dataclass(frozen=True)
class Settings:
    seeds: tuple[int, ...]
    ttt_cap_s: float
    # empty: no tuning, every system at the preset's point
    tune_seeds: tuple[int, ...] = ()
    grid: tuple[tuple[float, float], ...] = GRID
    # read runs saved under ROOT/outcomes instead of running them again
    reuse: bool = False


QUICK = Settings(seeds=(0,), ttt_cap_s=300.0)
FULL = Settings(seeds=(0, 1, 2, 3, 4), ttt_cap_s=600.0, tune_seeds=(0, 1))


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
    # algo.reference_on: actors (overlaps the reward scoring, which runs in worker processes)
    "reference pass": "streamrl_actor_reference_seconds_total",
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
    # time.monotonic()
    at: float
    # "role:ident" -> flattened metrics
    by_target: dict[str, dict[str, float]]


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
        # a process between restarts or shutting down
        except OSError:
            continue
    return Scrape(at, by_target)


# ----- one run -------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One training run, whichever system: the per-step curve and its throughput."""

    system: str
    seed: int
    cap_s: float
    # (seconds since launch, reward mean, exact match) per step
    curve: list[tuple[float, float, float]]
    samples_per_s: float
    tokens_per_s: float
    wall_s: float
    extra: dict = field(default_factory=dict)
    scrapes: list[Scrape] = field(default_factory=list)
    # completions consumed per curve point (streamrl: groups x G of the step; loops: the rollout)
    samples: list[int] = field(default_factory=list)
    # generated tokens the learner never trained (stale), over all generated; None where not counted
    wasted_fraction: float | None = None
    # the task's target bars: reward, exact match
    bars: tuple[float, float] = (TARGET_REWARD, TARGET_EXACT)

    def target_index(self, reward: float, exact: float = 0.0) -> int | None:
        """Curve index closing the first ``WINDOW`` points whose means reach both bars (learner.target)."""
        rows = [{run_target.REWARD: r, EXACT_PART: e} for _, r, e in self.curve]
        bars = {run_target.REWARD: reward, EXACT_PART: exact}
        return run_target.first_reached(rows, bars, WINDOW)

    def time_to(self, reward: float, exact: float = 0.0) -> float | None:
        """Seconds since launch at the end of the first ``WINDOW`` steps whose means reach both bars."""
        end = self.target_index(reward, exact)
        return None if end is None else self.curve[end][0]

    @property
    def time_to_target_s(self) -> float | None:
        return self.time_to(*self.bars)

    @property
    def time_from_first_step_s(self) -> float | None:
        """Time to target counted from the end of the first training step (start-up left out)."""
        ttt = self.time_to_target_s
        return None if ttt is None else ttt - self.curve[0][0]

    @property
    def samples_to_target(self) -> int | None:
        end = self.target_index(*self.bars)
        return None if end is None or not self.samples else sum(self.samples[: end + 1])

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


def seed_folder(seed: int, task: Task = DEMO) -> Path:
    return ROOT / (f"seed{seed}" if task is DEMO else f"{task.name}-seed{seed}")


def seed_inputs(seed: int, task: Task = DEMO) -> tuple[Path, Path]:
    """The warmed policy and the prompts of one seed, built once and shared by streamrl and TRL."""
    folder = seed_folder(seed, task)
    # TRL's run_trl looks for <workdir>/policy and <workdir>/data/train.jsonl: the same files.
    return task.build_policy(folder / "policy", seed=seed), task.write_dataset(
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
    if "bars" in data:
        data["bars"] = tuple(data["bars"])
    return Outcome(**data)


def run_streamrl(
    system: str,
    seed: int,
    extra: list[str],
    actors: int,
    cap_s: float,
    stop_at_target: bool,
    reuse: bool = False,
    task: Task = DEMO,
) -> Outcome:
    """Launch the system, poll it, scrape every process, stop at the target or the cap."""
    name = f"bench-{system.replace(' ', '').replace(',', '-').replace('=', '')}-s{seed}".lower()
    if task is not DEMO:
        name = f"{task.name}-{name}"
    saved = saved_path(name, cap_s)
    if reuse and saved.exists():
        print(f"   {system} seed {seed}: reusing {saved}", flush=True)
        return load_outcome(saved)
    outcome = _launch_and_watch(system, name, seed, extra, actors, cap_s, stop_at_target, task)
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
    task: Task = DEMO,
) -> Outcome:
    from streamrl.configs import load_config
    from streamrl.launch.status import read_steps
    from streamrl.launch.supervisor import Supervisor

    policy, data = seed_inputs(seed, task)
    overrides = [
        f"run.seed={seed}",
        f"run.name={name}",
        f"run.dir={ROOT / name}",
        f"run.max_time_s={cap_s:g}",
        f"model.path={policy}",
        f"data.path={data}",
        *extra,
    ]
    cfg = load_config(task.config, overrides, env={})
    # each run starts over: a finished run of the same name would be resumed, not measured
    sup = Supervisor(cfg, actors=actors, overwrite=True)
    print(
        f"   {system} seed {seed}: {' '.join(extra) or 'demo config'}, {actors} actor(s), cap {cap_s:g} s",
        flush=True,
    )
    scrapes, started_unix, wall_s = _watch(sup, cap_s, stop_at_target, task)
    # The learner's own clock starts after its start-up: steps past the cap (from the launch) do not count.
    steps = [s for s in read_steps(sup.run_dir) if s["time"] - started_unix <= cap_s]
    print(f"   -> {len(steps)} steps in {wall_s:.0f} s", flush=True)
    group_size = cfg.rollout.group_size
    curve = curve_of(steps, started_unix, task.exact_part, cfg.reward_ranges)
    loop_s = steps[-1]["time"] - steps[0]["time"] if len(steps) > 1 else 0.0
    # Steady-state loop, start-up excluded (as TRL's samples/s): completions the learner took after its first step.
    samples_per_s = sum(s["groups"] * group_size for s in steps[1:]) / loop_s if loop_s > 0 else 0.0
    return Outcome(
        system,
        seed,
        cap_s,
        curve,
        samples_per_s,
        generated_tokens_per_s(scrapes),
        wall_s,
        samples=[s["groups"] * group_size for s in steps],
        wasted_fraction=stale_token_fraction(scrapes),
        bars=task.target()[:2],
        extra={
            "steps": steps,
            "updates_per_batch": cfg.learner.updates_per_batch,
            "versions_per_batch": cfg.learner.versions_per_batch,
            "max_staleness": cfg.algo.max_staleness,
            "groups_per_step": cfg.learner.groups_per_step,
            "overrides": extra,
            "actors": actors,
        },
        scrapes=scrapes,
    )


def curve_of(
    steps: list[dict], started_unix: float, exact_part: str, ranges: dict
) -> list[tuple[float, float, float]]:
    """(seconds since launch, mean reward, exact-match part) per learner step row, each figure
    clipped to its declared range as the learner clips it to judge its target."""
    clipped = [run_target.measures(s, ranges) for s in steps]
    return [
        (s["time"] - started_unix, m[run_target.REWARD], m.get(exact_part, math.nan))
        for s, m in zip(steps, clipped, strict=True)
    ]


def _watch(
    sup, cap_s: float, stop_at_target: bool, task: Task
) -> tuple[list[Scrape], float, float]:
    """Start the supervisor's run and tick it until the learner finishes, the task's target is
    reached (``stop_at_target``) or ``cap_s`` plus a grace has passed, scraping every process every
    ``SCRAPE_EVERY_S``; then stop it. (scrapes, the launch's Unix time, wall seconds)."""
    from streamrl.launch.status import read_steps, time_to_target

    reward_bar, exact_bar, window = task.target()
    bars = {run_target.REWARD: reward_bar, task.exact_part: exact_bar}
    goal = run_target.Target(bars, window, sup.cfg.reward_ranges)
    scrapes: list[Scrape] = []
    started, started_unix = time.monotonic(), time.time()
    last_scrape = started
    try:
        sup.start()
        while not sup.learner_finished and time.monotonic() - started < cap_s + STOP_GRACE_S:
            sup.tick()
            if time.monotonic() - last_scrape >= SCRAPE_EVERY_S:
                last_scrape = time.monotonic()
                scrapes.append(scrape_all(sup.redis, sup.keys))
            steps = read_steps(sup.run_dir) if stop_at_target else []
            if stop_at_target and time_to_target(steps, started_unix, goal) is not None:
                scrapes.append(scrape_all(sup.redis, sup.keys))
                break
            time.sleep(POLL_S)
    finally:
        sup.stop()
    return scrapes, started_unix, time.monotonic() - started


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


def stale_token_fraction(scrapes: list[Scrape]) -> float | None:
    """Stale tokens the learner dropped or masked over the tokens all actors generated (last scrape
    that saw the learner and an actor); None before both were scraped."""
    seen = [
        s
        for s in scrapes
        if "learner:0" in s.by_target and any(t.startswith("actor:") for t in s.by_target)
    ]
    if not seen:
        return None
    last = seen[-1].by_target
    generated = sum(
        m.get("streamrl_actor_tokens_generated_total", 0.0)
        for t, m in last.items()
        if t.startswith("actor:")
    )
    stale = last["learner:0"].get("streamrl_learner_dropped_stale_tokens_total", 0.0)
    return stale / generated if generated else None


def run_loop_outcome(
    system: str,
    seed: int,
    point: tuple[float, float],
    cap_s: float,
    reuse: bool = False,
    task: Task = DEMO,
    extra: list[str] | tuple[str, ...] = (),
    device: str = "cpu",
) -> Outcome:
    """The reference loop or TRL on one seed at one grid point (saved like the streamrl runs);
    ``extra``: more preset overrides (the reference loop's ``carry-optimizer`` is one of them);
    ``device``: the reference loop's (TRL runs on the CPU)."""
    if device != "cpu" and system != REFERENCE:
        raise ValueError(f"{system} runs on the CPU only here, not on {device}")
    tag = "reference" if system == REFERENCE else "trl"
    if task is not DEMO:
        tag = f"{task.name}-{tag}"
    if device != "cpu":
        tag = f"{tag}-{device.replace(':', '')}"
    extra = list(extra)
    carry = CARRY in extra
    overrides = [*point_overrides(point), *(o for o in extra if o != CARRY)]
    suffix = "".join(f"-{o}" for o in extra).replace("=", "")
    saved = saved_path(f"{tag}-s{seed}-lr{point[0]:g}-kl{point[1]:g}{suffix}", cap_s)
    if reuse and saved.exists():
        print(f"   {system} seed {seed}: reusing {saved}", flush=True)
        return load_outcome(saved)
    seed_inputs(seed, task)
    print(f"   {system} seed {seed}: {' '.join(overrides)}, cap {cap_s:g} s", flush=True)
    started = time.monotonic()
    if system == REFERENCE:
        from bench.reference_loop import run_reference

        result = run_reference(
            seed,
            cap_s,
            seed_folder(seed, task),
            overrides,
            carry,
            echo=lambda line: None,
            task=task,
            device=device,
        )
    else:
        from bench.trl_baseline import run_trl

        result = run_trl(seed, cap_s, seed_folder(seed, task), True, overrides, task)
    wall_s = time.monotonic() - started
    print(f"   -> {result['steps']} rollouts in {wall_s:.0f} s", flush=True)
    from streamrl.configs import load_config

    cfg = load_config(task.config, overrides, env={})
    rollout = cfg.learner.groups_per_step * cfg.rollout.group_size
    outcome = Outcome(
        system,
        seed,
        cap_s,
        [tuple(p) for p in result["curve"]],
        result["samples_per_s"],
        result["tokens_per_s"],
        wall_s,
        extra={
            "setup_s": result["setup_s"],
            "overrides": [*overrides, *([CARRY] if carry else [])],
        },
        samples=[rollout] * len(result["curve"]),
        # a synchronous loop trains every token it generates
        wasted_fraction=0.0,
        bars=task.target()[:2],
    )
    save_outcome(outcome, saved)
    return outcome


# ----- 1. time to target ---------------------------------------------------------------------

ASYNC, SYNC, REFERENCE, TRL = (
    "streamrl async",
    "streamrl sync",
    "reference loop",
    "TRL GRPOTrainer",
)
SYSTEMS = (ASYNC, SYNC, REFERENCE, TRL)
# streamrl variants: extra overrides and actor processes
STREAMRL = {ASYNC: ([], 2), SYNC: (["algo.max_staleness=0"], 1)}


@dataclass
class TimeToTarget:
    """Every run of the ``ttt`` part: the grid on the tune seeds, and each system at its best."""

    grid: dict[str, dict[tuple[float, float], list[Outcome]]]
    best: dict[str, tuple[float, float]]
    results: dict[str, list[Outcome]]


def run_one(
    system: str, seed: int, point: tuple[float, float], settings: Settings, memo: dict
) -> Outcome:
    """One run, done once per invocation (a tune run is reused by the final runs of its seed)."""
    key = (system, seed, point)
    if key not in memo:
        if system in STREAMRL:
            extra, actors = STREAMRL[system]
            label = f"{system}, {point_label(point)}"
            memo[key] = run_streamrl(
                label,
                seed,
                [*extra, *point_overrides(point)],
                actors,
                settings.ttt_cap_s,
                True,
                settings.reuse,
            )
            memo[key].system = system
        else:
            memo[key] = run_loop_outcome(system, seed, point, settings.ttt_cap_s, settings.reuse)
    return memo[key]


def rank_key(outcomes: list[Outcome]) -> tuple[float, float]:
    """Best first: the lower median time to target, then (all missed) the higher reward reached."""
    return median_ttt(outcomes), -statistics.fmean(o.reached[0] for o in outcomes)


def run_time_to_target(settings: Settings) -> TimeToTarget:
    memo: dict = {}
    grid: dict[str, dict[tuple[float, float], list[Outcome]]] = {s: {} for s in SYSTEMS}
    points = settings.grid if settings.tune_seeds else (preset_point(),)
    for seed in settings.tune_seeds:
        for point in points:
            for system in SYSTEMS:
                outcome = run_one(system, seed, point, settings, memo)
                grid[system].setdefault(point, []).append(outcome)
    best = {
        system: min(grid[system].items(), key=lambda item: rank_key(item[1]))[0]
        if grid[system]
        else points[0]
        for system in SYSTEMS
    }
    results: dict[str, list[Outcome]] = {s: [] for s in SYSTEMS}
    for seed in settings.seeds:
        for system in SYSTEMS:
            results[system].append(run_one(system, seed, best[system], settings, memo))
    return TimeToTarget(grid, best, results)


def median_ttt(outcomes: list[Outcome], milestone: bool = False) -> float:
    """Median time to the target (or the milestone); a run that missed it counts as infinitely slow."""
    times = (o.time_to_milestone_s if milestone else o.time_to_target_s for o in outcomes)
    return statistics.median(t if t is not None else math.inf for t in times)


def median_of(values: list[float | None]) -> float:
    """Median where a missing value (the target not reached) counts as infinite."""
    return statistics.median(v if v is not None else math.inf for v in values)


def ratio_cell(num: float, den: float, goal: float | None = None) -> str:
    if math.isinf(num) or math.isinf(den) or den <= 0:
        return "n/a (a side missed the target on more than half the seeds)"
    ratio = num / den
    verdict = "" if goal is None else f" (goal ≤ {goal}×: {'met' if ratio <= goal else 'not met'})"
    return f"**{ratio:.2f}×**{verdict}"


def _ttt_cell(o: Outcome) -> str:
    ttt = o.time_to_target_s
    if ttt is not None:
        return f"{ttt:.0f} s"
    reward, exact = o.reached
    return f"not in {o.cap_s:.0f} s (reached {reward:.3f} / {exact:.2f})"


def _fmt_s(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.0f} s"


def _waste_cell(outcomes: list[Outcome]) -> str:
    values = [o.wasted_fraction for o in outcomes if o.wasted_fraction is not None]
    return f"{statistics.fmean(values):.1%}" if values else "–"


def plot_curves(results: dict[str, list[Outcome]], path: Path) -> None:
    """Reward (window mean) against wall time and against samples consumed, every system side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_samples) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for i, (system, outcomes) in enumerate(results.items()):
        for j, o in enumerate(outcomes):
            if not o.curve:
                continue
            reward = rolling_mean([r for _, r, _ in o.curve])
            label = system if j == 0 else None
            by_time.plot([t for t, _, _ in o.curve], reward, color=f"C{i}", lw=1, label=label)
            if o.samples:
                consumed = [sum(o.samples[: k + 1]) for k in range(len(o.samples))]
                by_samples.plot(consumed, reward, color=f"C{i}", lw=1, label=label)
    by_time.set_xlabel("wall time since launch (s)")
    by_samples.set_xlabel("completions consumed")
    by_time.set_ylabel(f"reward ({WINDOW}-step mean)")
    for ax in (by_time, by_samples):
        ax.axhline(TARGET_REWARD, color="grey", lw=0.8, ls=":")
        ax.grid(alpha=0.3)
    by_samples.legend(fontsize=8, loc="lower right")
    fig.suptitle(
        "Time to target on the CPU demo task, each system at its best grid point, every seed"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _medians(outcomes: list[Outcome]) -> dict[str, float]:
    """Medians over seeds of the time to target from the launch and from the first step, and of
    the completions to target (a miss counts as infinite)."""
    return {
        "launch": median_ttt(outcomes),
        "first_step": median_of([o.time_from_first_step_s for o in outcomes]),
        "samples": median_of([o.samples_to_target for o in outcomes]),
    }


def _system_row(
    system: str, point: tuple[float, float], outcomes: list[Outcome], m: dict[str, float]
) -> str:
    """One system's row of the time-to-target table, ``m`` its ``_medians``."""
    times = [o.time_to_target_s for o in outcomes if o.time_to_target_s is not None]
    spread = (
        f"{min(times):.0f}–{max(times):.0f} s ({len(times)}/{len(outcomes)} reached)"
        if times
        else f"– (0/{len(outcomes)} reached)"
    )
    samples = m["samples"]
    return (
        f"| {system} | {point_label(point)} | {_fmt_s(m['launch'])} | "
        f"{_fmt_s(m['first_step'])} | {spread} | "
        f"{'∞' if math.isinf(samples) else f'{samples:,.0f}'} | "
        f"{statistics.fmean(o.samples_per_s for o in outcomes):.0f} | {_waste_cell(outcomes)} | "
        + "; ".join(f"s{o.seed}: {_ttt_cell(o)}" for o in outcomes)
        + " |"
    )


def _grid_part(ttt: TimeToTarget, settings: Settings) -> list[str]:
    """The grid's table (median time to target per system and point over the tune seeds), or the
    line that says there was no grid."""
    if not settings.tune_seeds:
        return [
            f"No grid in this run (`--quick`): every system at the preset's point, {point_label(preset_point())}.",
            "",
        ]
    grid_rows = [
        f"| {system} | "
        + " | ".join(
            f"{_fmt_s(median_ttt(points[p]))}" if p in points else "–" for p in settings.grid
        )
        + " |"
        for system, points in ttt.grid.items()
        if points
    ]
    return [
        f"Grid (median time to target from the launch over tune seeds "
        f"{', '.join(map(str, settings.tune_seeds))}; the best point of each system is used below):",
        "",
        "| system | " + " | ".join(point_label(p) for p in settings.grid) + " |",
        "|---|" + "---|" * len(settings.grid),
        *grid_rows,
        "",
    ]


def ttt_markdown(ttt: TimeToTarget, settings: Settings) -> str:
    results = ttt.results
    plot_curves(results, IMG_DIR / "system_curves.png")
    m = {system: _medians(outcomes) for system, outcomes in results.items()}
    rows = [
        _system_row(system, ttt.best[system], outcomes, m[system])
        for system, outcomes in results.items()
    ]
    return "\n".join(
        [
            "### Time to target on the CPU demo task",
            "",
            f"Target (`run.target_*` of `{CONFIG}`): {WINDOW}-step means of reward ≥ {TARGET_REWARD} and exact "
            f"match ≥ {TARGET_EXACT}. Seeds {', '.join(map(str, settings.seeds))} (warm-start seed = RL seed); "
            f"cap {settings.ttt_cap_s:.0f} s per run, each run stops at the target. Per seed the systems run "
            "back to back. Time from the launch includes Redis, learner and actor start-up (loops: model load, "
            "TRL's trainer set-up); the warmed policy is built beforehand, once per seed, and shared by all.",
            "",
            "- **streamrl async**: the preset, learner + 2 actors.",
            "- **streamrl sync**: the same with `algo.max_staleness=0` and 1 actor.",
            "- **reference loop**: `bench.reference_loop`, the plain one-process generate-then-train loop "
            "with the preset's recipe.",
            "- **TRL GRPOTrainer**: `bench.trl_baseline.run_trl` with every hyper-parameter TRL shares "
            "taken from the preset.",
            "",
            *_grid_part(ttt, settings),
            "| system | grid point | median time to target from launch | from the first step | spread "
            "| median completions to target | samples/s | wasted tokens (stale) | per seed |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            "![reward vs wall time and vs completions consumed](img/system_curves.png)",
            "",
            f"- async / reference loop, time from launch: {ratio_cell(m[ASYNC]['launch'], m[REFERENCE]['launch'], 0.75)}",
            f"- async / streamrl sync, time from launch: {ratio_cell(m[ASYNC]['launch'], m[SYNC]['launch'], 0.7)}",
            f"- async / TRL, time from launch: {ratio_cell(m[ASYNC]['launch'], m[TRL]['launch'], 0.5)}",
            f"- sync / reference loop, completions to target: {ratio_cell(m[SYNC]['samples'], m[REFERENCE]['samples'], 1.15)}",
            f"- async / reference loop, completions to target: {ratio_cell(m[ASYNC]['samples'], m[REFERENCE]['samples'], 1.25)}",
            "",
            "From the first step: time to target minus the end of the first training step (start-up left out). "
            "Completions to target: completions consumed up to the target step (streamrl: groups × G the learner "
            "took, zero-variance groups included; loops: rollouts × 256). samples/s: completions per second of "
            "the training loop, start-up excluded. Wasted tokens: tokens the learner dropped or masked as stale "
            "over all tokens the actors generated (Prometheus counters, last scrape; a synchronous loop wastes none).",
        ]
    )


# ----- curves ------------------------------------------------------------------------------


def rolling_mean(values: list[float], window: int = WINDOW) -> list[float]:
    """Mean of the last ``window`` values at each position (fewer at the start)."""
    return [statistics.fmean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]


# ----- 2. where time goes --------------------------------------------------------------------

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
            "`streamrl_actor_weight_swap_seconds`, `streamrl_actor_reference_seconds_total` (the frozen initial policy scoring "
            "the completions for the KL term, `algo.reference_on: actors`); learner: `streamrl_learner_step_phase_seconds{phase}`. "
            "`other` is the rest (actors: reward scoring not overlapped by the reference pass, XADD; learner: the reference "
            "pass when the learner runs it, batch preparation, acks, logging). The weights "
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
    tune_seeds: tuple[int, ...] | None = None,
    cap_s: float | None = None,
) -> str:
    """The Markdown section of the system benchmarks."""
    import torch

    torch.set_num_threads(1)
    unknown = set(only) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    settings = QUICK if quick else FULL
    settings = replace(
        settings,
        seeds=tuple(seeds) if seeds else settings.seeds,
        tune_seeds=settings.tune_seeds if tune_seeds is None else tuple(tune_seeds),
        ttt_cap_s=cap_s or settings.ttt_cap_s,
        reuse=reuse,
    )
    command = command or "make bench" + (" --quick" if quick else "")
    started = time.monotonic()
    body = []
    async_run = None
    if "ttt" in only:
        print("== time to target", flush=True)
        ttt = run_time_to_target(settings)
        async_run = ttt.results[ASYNC][0]
        body.append(ttt_markdown(ttt, settings))
    if "time" in only:
        print("== where time goes", flush=True)
        if async_run is None:
            async_run = run_streamrl(
                ASYNC, settings.seeds[0], [], 2, settings.ttt_cap_s, True, settings.reuse
            )
        try:
            body.append(time_markdown(async_run))
        # e.g. a run that hit the target before two scrapes
        except ValueError as exc:
            body.append(f"### Where time goes\n\nNot measured in this run: {exc}.")
    header = [
        "## System: async vs synchronous vs a plain loop vs TRL, where time goes",
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
        "--quick",
        action="store_true",
        help="smoke run: seed 0, no grid (every system at the preset's point), shorter caps",
    )
    parser.add_argument(
        "--seeds", default=None, help="comma-separated seeds (default 0,1,2,3,4; quick: 0)"
    )
    parser.add_argument(
        "--tune-seeds",
        default=None,
        help="comma-separated seeds the grid is run on to pick each system's best point "
        "(default 0,1; quick: none; an empty string skips the grid)",
    )
    parser.add_argument(
        "--only", default=",".join(PARTS), help=f"comma-separated parts of {','.join(PARTS)}"
    )
    parser.add_argument(
        "--cap-s", type=float, default=None, help="time cap of one time-to-target run (seconds)"
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
    tune = (
        None if args.tune_seeds is None else tuple(int(s) for s in args.tune_seeds.split(",") if s)
    )
    command = command_line("bench.system", argv)
    only = tuple(p for p in args.only.split(",") if p)
    publish(SECTION, run(args.quick, seeds, only, command, args.reuse, tune, args.cap_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
