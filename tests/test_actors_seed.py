"""An actor's sampling seed depends on the run seed and its actor id only, in every process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from streamrl.actors.loop import sampling_seed

ROOT = Path(__file__).resolve().parents[1]


def _seed_in_a_process(run_seed: int, actor_id: str, hash_seed: str) -> int:
    code = f"from streamrl.actors.loop import sampling_seed; print(sampling_seed({run_seed}, {actor_id!r}))"
    env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout)


def test_two_processes_with_different_hash_salts_derive_the_same_seed_for_an_actor_id():
    # str hashes differ between these two processes; the seed must not
    first = _seed_in_a_process(7, "host-1234", hash_seed="1")
    second = _seed_in_a_process(7, "host-1234", hash_seed="2")
    assert first == second == sampling_seed(7, "host-1234")


def test_different_actor_ids_of_one_run_get_different_seeds():
    ids = [f"actor-{i}" for i in range(256)] + [f"host-{pid}" for pid in range(1000, 1256)]
    seeds = {sampling_seed(0, actor_id) for actor_id in ids}
    assert len(seeds) == len(ids)


def test_one_actor_id_gets_a_different_seed_in_a_run_with_another_seed():
    assert sampling_seed(0, "actor-0") != sampling_seed(1, "actor-0")


def test_seeds_fit_in_32_bits_for_any_run_seed():
    for run_seed in (0, 1, -1, 2**40):
        assert 0 <= sampling_seed(run_seed, "actor-0") < 2**32
