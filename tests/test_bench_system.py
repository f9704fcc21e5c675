"""The pure parts of the system benchmark: parsing /metrics pages and turning counters into time shares."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from bench.system import (
    TARGET_EXACT,
    TARGET_REWARD,
    WINDOW,
    Outcome,
    Scrape,
    breakdown,
    flatten_metrics,
    load_outcome,
    rank_key,
    rolling_mean,
    sample_key,
    save_outcome,
    stale_token_fraction,
    time_shares,
)


def _page(generate_s: float, wait_s: float, swaps: list[float], reference_s: float = 0.0) -> str:
    """A real prometheus-client exposition page with the actor metrics of docs/architecture.md."""
    registry = CollectorRegistry()
    Counter("streamrl_actor_generate_seconds_total", "g", registry=registry).inc(generate_s)
    Counter("streamrl_actor_admission_wait_seconds_total", "w", registry=registry).inc(wait_s)
    Counter("streamrl_actor_reference_seconds_total", "r", registry=registry).inc(reference_s)
    swap = Histogram("streamrl_actor_weight_swap_seconds", "s", registry=registry)
    for s in swaps:
        swap.observe(s)
    return generate_latest(registry).decode()


def _learner_page(phases: dict[str, float], steps: int = 1) -> str:
    registry = CollectorRegistry()
    Counter("streamrl_learner_steps_total", "s", registry=registry).inc(steps)
    hist = Histogram("streamrl_learner_step_phase_seconds", "p", ["phase"], registry=registry)
    for phase, seconds in phases.items():
        hist.labels(phase).observe(seconds)
    return generate_latest(registry).decode()


def test_flattened_page_keeps_counter_totals_histogram_sums_and_labels():
    flat = flatten_metrics(_page(3.5, 1.0, [0.25, 0.5]))
    assert flat["streamrl_actor_generate_seconds_total"] == 3.5
    assert flat["streamrl_actor_weight_swap_seconds_sum"] == 0.75
    assert flat["streamrl_actor_weight_swap_seconds_count"] == 2
    learner = flatten_metrics(_learner_page({"wait": 2.0, "optimizer": 0.5}))
    assert learner[sample_key("streamrl_learner_step_phase_seconds_sum", {"phase": "wait"})] == 2.0


def test_actor_shares_are_counter_increases_over_the_window_with_swaps_taken_out_of_generating():
    before = flatten_metrics(_page(10.0, 2.0, [0.5], reference_s=1.0))
    after = flatten_metrics(_page(70.0, 12.0, [0.5, 1.5, 0.5], reference_s=6.0))
    shares = time_shares("actor", before, after, window_s=100.0)
    assert shares["weight swap"] == pytest.approx(0.02)
    assert shares["generating"] == pytest.approx(0.60 - 0.02)
    assert shares["admission wait"] == pytest.approx(0.10)
    assert shares["reference pass"] == pytest.approx(0.05)
    assert shares["other"] == pytest.approx(0.25)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_learner_shares_cover_every_phase_and_other_is_never_negative():
    before = flatten_metrics(_learner_page({"wait": 1.0}))
    after = flatten_metrics(
        _learner_page({"wait": 30.0, "forward_backward": 50.0, "optimizer": 30.0, "publish": 1.0})
    )
    shares = time_shares("learner", before, after, window_s=100.0)
    assert shares["waiting for data"] == pytest.approx(0.29)
    assert shares["forward/backward"] == pytest.approx(0.50)
    assert shares["checkpoint"] == 0.0
    # 1.1 of the window measured (rounding of phase clocks): clamped, not negative
    assert shares["other"] == 0.0


def test_time_shares_reject_an_empty_window():
    with pytest.raises(ValueError, match="window"):
        time_shares("actor", {}, {}, window_s=0.0)


def test_breakdown_starts_after_the_learners_first_step_and_ends_at_the_last_scrape():
    idle = Scrape(
        0.0,
        {
            "learner:0": flatten_metrics(_learner_page({}, steps=0)),
            "actor:a0": flatten_metrics(_page(5, 0, [])),
        },
    )
    first = Scrape(
        10.0,
        {
            "learner:0": flatten_metrics(_learner_page({"wait": 2.0})),
            "actor:a0": flatten_metrics(_page(10, 0, [])),
        },
    )
    last = Scrape(
        60.0,
        {
            "learner:0": flatten_metrics(_learner_page({"wait": 12.0})),
            "actor:a0": flatten_metrics(_page(40, 5, [])),
            "redis:x": {},
        },
    )
    window, shares, background = breakdown([idle, first, last])
    assert window == 50.0
    assert set(shares) == {"learner:0", "actor:a0"}
    assert shares["actor:a0"]["generating"] == pytest.approx(30 / 50)
    assert shares["learner:0"]["waiting for data"] == pytest.approx(10 / 50)
    assert set(background) == {"actor:a0"}
    with pytest.raises(ValueError, match="two scrapes"):
        breakdown([idle, first])


def test_time_to_target_uses_the_presets_window_and_both_bars():
    assert (TARGET_REWARD, TARGET_EXACT, WINDOW) == (0.95, 0.85, 20)
    low, high = (TARGET_REWARD, TARGET_EXACT - 0.05), (TARGET_REWARD, TARGET_EXACT + 0.05)
    curve = [(float(t), *low) for t in range(WINDOW)]
    curve += [(float(t), *high) for t in range(WINDOW, WINDOW + 30)]
    outcome = Outcome("x", 0, 100.0, curve, 1.0, 1.0, 50.0, samples=[256] * len(curve))
    # the exact-match mean first reaches the bar when half of the window is past the low stretch
    first = WINDOW + WINDOW // 2 - 1
    assert outcome.time_to_target_s == float(first)
    # the first point sits at t = 0
    assert outcome.time_from_first_step_s == float(first)
    assert outcome.samples_to_target == 256 * (first + 1)
    # reward alone, from the first full window
    assert outcome.time_to_milestone_s == float(WINDOW - 1)
    missed = Outcome("x", 0, 100.0, [(1.0, 0.5, 0.25)] * (WINDOW + 1), 1.0, 1.0, 6.0)
    assert missed.time_to_target_s is None and missed.samples_to_target is None
    assert missed.time_to_milestone_s is None
    assert missed.reached == (0.5, 0.25)
    assert all(math.isnan(v) for v in Outcome("x", 0, 1.0, [], 0.0, 0.0, 0.0).reached)


def test_each_system_takes_the_grid_point_with_the_lowest_median_time_then_the_highest_reward():
    def runs(*times, reward=0.99):
        out = []
        for t in times:
            curve = [(1.0, reward, 0.9)] * WINDOW if t is not None else [(1.0, 0.5, 0.1)] * WINDOW
            out.append(
                Outcome("x", 0, 9.0, [(p[0] if t is None else t, *p[1:]) for p in curve], 1, 1, 1)
            )
        return out

    grid = {
        (3e-4, 0.0): runs(50.0, None),
        (6e-4, 0.0): runs(40.0, 45.0),
        (6e-4, 0.1): runs(None, None),
    }
    assert min(grid.items(), key=lambda item: rank_key(item[1]))[0] == (6e-4, 0.0)
    # nobody reached the target: the higher reward reached wins
    missed = {(3e-4, 0.0): runs(None, reward=0.5), (6e-4, 0.1): runs(None, reward=0.5)}
    missed[(6e-4, 0.1)][0].curve = [(1.0, 0.8, 0.1)] * WINDOW
    assert min(missed.items(), key=lambda item: rank_key(item[1]))[0] == (6e-4, 0.1)


def test_wasted_fraction_is_stale_tokens_over_every_actors_generated_tokens():
    registry = CollectorRegistry()
    Counter("streamrl_learner_dropped_stale_tokens", "d", registry=registry).inc(30)
    learner = flatten_metrics(generate_latest(registry).decode())
    actor = {"streamrl_actor_tokens_generated_total": 500.0}
    early = Scrape(1.0, {"actor:a0": actor})
    late = Scrape(2.0, {"learner:0": learner, "actor:a0": actor, "actor:a1": actor})
    assert stale_token_fraction([early]) is None
    assert stale_token_fraction([early, late]) == pytest.approx(30 / 1000)


def test_rolling_mean_averages_the_last_window_values():
    assert rolling_mean([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]


def test_a_saved_run_reads_back_equal(tmp_path):
    scrape = Scrape(3.0, {"actor:a0": flatten_metrics(_page(1.0, 0.5, [0.1]))})
    outcome = Outcome(
        "streamrl async",
        1,
        180.0,
        [(1.5, 0.3, 0.0)],
        10.0,
        20.0,
        30.0,
        {"steps": [{"step": 1}]},
        [scrape],
        [256],
        0.25,
    )
    save_outcome(outcome, tmp_path / "o.json")
    assert load_outcome(tmp_path / "o.json") == outcome
