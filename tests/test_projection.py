"""The projection's arithmetic against numbers worked out by hand."""

from __future__ import annotations

import pytest

from bench.projection import (
    Workload,
    async_step_s,
    best_split,
    colocated_step_s,
    device_seconds,
    learner_bound_ratio,
    parse_actor_tps,
    parse_learner_tps,
    publish_seconds,
    sync_step_s,
    train_tps_from_flops,
)


def test_workload_counts_completion_tokens_for_generation_and_all_tokens_for_training():
    work = Workload(prompts=4, group_size=8, prompt_tokens=10, completion_tokens=30)
    assert work.generated_tokens == 4 * 8 * 30 == 960
    assert work.trained_tokens == 4 * 8 * 40 == 1280
    assert device_seconds(work, gen_tps=96, train_tps=640) == (10.0, 2.0)


def test_device_seconds_rejects_a_non_positive_throughput():
    with pytest.raises(ValueError, match="positive"):
        device_seconds(Workload(1, 1, 1, 1), gen_tps=0, train_tps=1)


def test_sync_adds_the_phases_and_async_overlaps_them():
    # gen 12 s over 3 actors = 4 s, train 6 s over 2 learners = 3 s, publish 0.5 s
    assert sync_step_s(12, 6, 3, 2, 0.5) == 4 + 3 + 0.5
    assert async_step_s(12, 6, 3, 2, 0.5) == 4 + 0.5
    # every one of 5 devices does both: (12 + 6) / 5 + 0.5
    assert colocated_step_s(12, 6, 5, 0.5) == pytest.approx(4.1)


def test_balanced_split_without_publish_halves_the_step():
    assert sync_step_s(8, 4, 2, 1, 0) / async_step_s(8, 4, 2, 1, 0) == 2.0


def test_learner_becomes_the_bottleneck_above_gen_over_train_actors_per_learner():
    ratio = learner_bound_ratio(9, 3)
    assert ratio == 3.0
    # at exactly 3 actors per learner both sides take 3 s; one more actor leaves the learner as the limit
    assert async_step_s(9, 3, 3, 1, 0) == 3.0 == async_step_s(9, 3, 4, 1, 0)


def test_best_split_picks_the_integer_split_with_the_shortest_async_step():
    # gen 9, train 3 on 4 devices: 3:1 gives max(3, 3) = 3; 2:2 gives 4.5; 1:3 gives 9
    assert best_split(9, 3, 4, 0.25) == (3, 1, 3.25)
    with pytest.raises(ValueError):
        best_split(9, 3, 1, 0)


def test_training_tokens_per_second_from_flops_uses_six_flops_per_parameter_per_token():
    assert train_tps_from_flops(600e12, 1e9) == pytest.approx(100_000)


def test_publish_seconds_is_bytes_over_bandwidth():
    assert publish_seconds(8e9, 2, 50e9) == pytest.approx(0.32)


def test_parsers_read_our_benchmark_tables_and_return_none_when_absent():
    actors_md = "| batch | ours tokens/s | HF |\n|---:|---:|---:|\n| 1 | 812 | 586 |\n| 16 | 8,851 | 7,412 |\n"
    assert parse_actor_tps(actors_md) == 8851.0
    assert parse_actor_tps("nothing here") is None
    learner_md = (
        "| model | params | batch | plain AdamW ms | ZeRO-2 ms | ratio | ZeRO-2 completion tokens/s |\n"
        "|---|---|---|---|---|---|---|\n"
        "| demo (0.5M) | 0.5M | 64x128 (1 micro) | 300 | 320 | 1.07x | 22,400 |\n"
        "| qwen2-10M | 10.6M | 64x128 (2 micro) | 900 | 1000 | 1.11x | 7,168 |\n"
    )
    # completion tokens/s scaled to all tokens: 22,400 x (16 + 112) / 112
    assert parse_learner_tps(learner_md) == pytest.approx(25_600)
    assert parse_learner_tps("| step | 5 ms |") is None
