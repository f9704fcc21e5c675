"""bench.staleness: the lagged reference loop's grid, its determinism and its page."""

from __future__ import annotations

import shutil

import pytest

from bench.reference_loop import run_reference
from bench.staleness import median_rollouts, run_grid, section

SMALL = ["learner.groups_per_step=2", "rollout.group_size=4", "learner.lr=1e-2"]


@pytest.mark.timeout(180)
def test_a_lagged_run_is_the_same_every_time_so_runs_may_share_the_cores(tmp_path, demo_policy):
    shutil.copytree(demo_policy, tmp_path / "policy")

    def rewards():
        result = run_reference(
            1, 60.0, tmp_path, SMALL, lag=1, max_rollouts=4, echo=lambda line: None
        )
        return [r for _, r, _ in result["curve"]]

    first = rewards()
    assert len(first) == 4
    assert rewards() == first


@pytest.mark.timeout(180)
def test_the_grid_runs_every_seed_and_lag_in_worker_processes(tmp_path, demo_policy):
    shutil.copytree(demo_policy, tmp_path / "seed0" / "policy")
    results = run_grid([0], [0, 1], 2, 2, SMALL, tmp_path)
    assert [(r["seed"], r["lag"], r["rollouts"]) for r in results] == [(0, 0, 2), (0, 1, 2)]
    # two rollouts from chance cannot reach the target
    assert all(r["rollouts_to_target"] is None for r in results)
    page = section(results, [0, 1], 2, "python -m bench.staleness")
    assert "| 0 | not in 2 (" in page
    assert "| median / lag 0 | n/a | n/a |" in page


def test_medians_count_a_miss_as_never():
    results = [
        {"seed": s, "lag": lag, "rollouts_to_target": n}
        for s, lag, n in [
            (0, 0, 300),
            (1, 0, 500),
            (2, 0, None),
            (0, 2, 400),
            (1, 2, None),
            (2, 2, None),
        ]
    ]
    assert median_rollouts(results, 0) == 500
    assert median_rollouts(results, 2) == float("inf")
    page_results = [{**r, "rollouts": 600, "last_reward": 0.5, "last_exact": 0.1} for r in results]
    page = section(page_results, [0, 2], 600, "cmd")
    assert "| 2 | not in 600 (0.50 / 0.10) | not in 600 (0.50 / 0.10) |" in page
    assert "| median | 500 | missed on half the seeds or more |" in page
