"""Actor processes end to end against a real Redis and the real shm weight publisher.

One scenario (module fixture), several properties: two actors start (a with
``actor.refill``, b without), a third
joins once groups are flowing, and together they stop at the admission bound
(no learner runs); then a learner step is simulated with the real pieces
(weights published over shm, version bumped, entries counted as consumed)
while a and b are frozen, so c alone fills the new bound on the new weights;
a and b resume and load them too; then a and b get SIGTERM and c SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import redis
import torch

from streamrl.broker.keys import Keys
from streamrl.broker.wire import decode_group
from streamrl.configs import Config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DATASET_ROWS = 5
# groups_per_step with max_staleness 0: the admission bound before any "learner" step
FIRST_BOUND = 12
SECOND_BOUND = FIRST_BOUND + 12


def _start_actor(actor_id: str, overrides: list[str], log_dir: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}", OMP_NUM_THREADS="1")
    log = open(log_dir / f"{actor_id}.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "streamrl.actors", "--actor-id", actor_id, *overrides],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _wait_for(predicate, timeout_s: float, what: str, procs=()) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        for proc in procs:
            assert proc.poll() is None, (
                f"an actor exited early with {proc.returncode} while waiting for {what}"
            )
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _groups(client: redis.Redis, keys: Keys):
    return [decode_group(fields[b"g"]) for _, fields in client.xrange(keys.stream)]


def _scrape(host_port: str) -> str:
    with urllib.request.urlopen(f"http://{host_port}/metrics", timeout=5) as response:
        return response.read().decode()


def _running_version(client: redis.Redis, keys: Keys, *actor_ids: str) -> list[int | None]:
    """The engine version each actor reports in its heartbeat (None before its first beat)."""
    beats = [client.hget(keys.actor(a), "version") for a in actor_ids]
    return [None if v is None else int(float(v)) for v in beats]


def _perturbed(policy_path: str, seed: int) -> dict[str, torch.Tensor]:
    from streamrl.policy.load import load_policy

    model = load_policy(policy_path)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=generator))
    return dict(model.named_parameters())


@pytest.fixture(scope="module")
def scenario(redis_server, demo_policy, tmp_path_factory):
    from streamrl.broker.admission import Admission, Bounds
    from streamrl.broker.client import connect_async
    from streamrl.broker.liveness import alive_actors
    from streamrl.weightsync.publisher import Publisher

    tmp = tmp_path_factory.mktemp("actors-loop")
    data = tmp / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"{n:03d}>", "answer": f"{n:03d}"[::-1]}) + "\n"
            for n in range(100, 100 + DATASET_ROWS)
        )
    )
    run_name = f"actors-{uuid.uuid4().hex[:8]}"
    overrides = [
        f"run.name={run_name}",
        f"run.dir={tmp / 'run'}",
        f"broker.redis_url={redis_server.url}",
        f"model.path={demo_policy}",
        f"data.path={data}",
        "rollout.group_size=2",
        "rollout.max_new_tokens=4",
        "actor.batch_slots=4",
        "actor.heartbeat_s=0.5",
        f"learner.groups_per_step={FIRST_BOUND}",
        "algo.max_staleness=0",
        "weightsync.transport=shm",
        "reward.functions=[{fn: 'streamrl.examples.reverse_digits:reverse_digits', name: reverse_digits},"
        " {fn: 'reward_plugins:raises'}]",
    ]
    cfg = Config.model_validate(
        {
            "run": {"name": run_name},
            "broker": {"redis_url": redis_server.url},
            "weightsync": {"transport": "shm"},
            "learner": {"groups_per_step": FIRST_BOUND},
            "algo": {"max_staleness": 0},
        }
    )
    keys = Keys.from_config(cfg.run, cfg.broker)
    client = redis.Redis.from_url(redis_server.url)
    procs = {}
    out = {"keys": keys, "client": client}
    publisher = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)

    def admission(call):
        """Run one Admission call (the learner's side of admission) with a client of its own."""

        async def run():
            r = connect_async(cfg.broker, cfg.run.dir)
            try:
                return await call(
                    Admission(
                        r,
                        Keys.from_config(cfg.run, cfg.broker),
                        Bounds.from_config(cfg.algo, cfg.learner),
                        cfg.broker.lease_ttl_s,
                    )
                )
            finally:
                await r.aclose()

        return asyncio.run(run())

    accepted = lambda: int(client.get(keys.accepted) or 0)  # noqa: E731
    try:
        # the learner is at version 1 but has not published weights yet: actors must wait for them
        admission(lambda a: a.set_version(1))
        # a keeps its decode batch full across groups (actor.refill), b generates batch by batch:
        # every property below holds for both
        procs["a"] = _start_actor("a", [*overrides, "actor.refill=true"], tmp)
        procs["b"] = _start_actor("b", overrides, tmp)
        _wait_for(
            lambda: _running_version(client, keys, "a", "b") == [0, 0],
            90,
            "a and b to wait",
            procs.values(),
        )
        publisher.publish(1, _perturbed(demo_policy, seed=1))
        _wait_for(
            lambda: client.xlen(keys.stream) > 0, 30, "the first published group", procs.values()
        )
        # joins a running system, after version 1 was published
        procs["c"] = _start_actor("c", overrides, tmp)
        _wait_for(
            lambda: accepted() >= FIRST_BOUND,
            60,
            "the actors to fill the admission bound",
            procs.values(),
        )
        _wait_for(
            lambda: _running_version(client, keys, "c") == [1],
            60,
            "c to load version 1",
            procs.values(),
        )
        # nobody may pass the bound while no learner consumes
        time.sleep(0.5)
        out["first"] = _groups(client, keys)
        targets = {k.decode(): v.decode() for k, v in client.hgetall(keys.metrics_targets).items()}
        out["metrics"] = {name: _scrape(targets[f"actor:{name}"]) for name in ("a", "b")}

        # one learner step: version 2 over shm, entries consumed, the bound moves. a and b are
        # frozen first (they hold no lease: the bound is full) so that the groups past the bound
        # can only come from c; who wins a race for leases is not what this scenario tests.
        for name in ("a", "b"):
            procs[name].send_signal(signal.SIGSTOP)
        publisher.publish(2, _perturbed(demo_policy, seed=2))
        admission(lambda a: a.set_version(2))
        admission(lambda a: a.set_consumed(SECOND_BOUND - FIRST_BOUND))
        _wait_for(
            lambda: accepted() >= SECOND_BOUND,
            60,
            "c to fill the bound after one learner step",
            procs.values(),
        )
        for name in ("a", "b"):
            procs[name].send_signal(signal.SIGCONT)
        _wait_for(
            lambda: _running_version(client, keys, "a", "b", "c") == [2, 2, 2],
            60,
            "a and b to resume and load version 2",
            procs.values(),
        )
        time.sleep(0.5)
        out["all"] = _groups(client, keys)
        out["alive_before_stop"] = {m.decode() for m in client.zrange(keys.actors, 0, -1)}
    finally:
        for name, proc in procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL if name == "c" else signal.SIGTERM)
        out["exit_codes"] = {name: proc.wait(timeout=30) for name, proc in procs.items()}
        publisher.close()
    # three missed heartbeats: the killed actor's heartbeat expires
    time.sleep(3 * 0.5 + 0.5)
    out["alive_after_stop"] = alive_actors(client, keys)
    out["leases_after_stop"] = client.zcard(keys.leases)
    out["targets_after_stop"] = client.hgetall(keys.metrics_targets)
    yield out
    client.close()


def test_two_actor_processes_never_take_the_same_prompt_in_an_epoch(scenario):
    groups = scenario["first"]
    # the admission bound holds with no learner
    assert len(groups) == FIRST_BOUND
    # which of a and b fills the first bound is theirs to race (one alone may); c alone fills the
    # second, so the groups of both bounds come from two processes or more, sharing one cursor
    assert {g.actor_id for g in groups} & {"a", "b"}
    assert {g.actor_id for g in scenario["all"][FIRST_BOUND:]} == {"c"}
    by_epoch: dict[int, list[int]] = {}
    for g in scenario["all"]:
        by_epoch.setdefault(int(g.meta["epoch"]), []).append(int(g.meta["row"]))
    # 24 groups of a 5-row dataset: epochs 0-3 whole, 4 rows of epoch 4, no row twice in one
    assert sorted(by_epoch) == [0, 1, 2, 3, 4]
    for rows in by_epoch.values():
        assert len(rows) == len(set(rows))
    assert all(sorted(by_epoch[e]) == list(range(DATASET_ROWS)) for e in range(4))
    for g in scenario["all"]:
        assert len(g.completions) == 2


def test_an_actor_added_mid_run_gets_prompts_and_the_published_weights(scenario):
    first, later = scenario["all"][:FIRST_BOUND], scenario["all"][FIRST_BOUND:]
    assert len(later) == SECOND_BOUND - FIRST_BOUND
    assert {g.actor_id for g in later} == {"c"}
    # max_staleness 0: every token comes from the learner's version at the time (1, then 2)
    for groups, version in ((first, 1), (later, 2)):
        for g in groups:
            assert all((c.versions == version).all() for c in g.completions), (g.actor_id, version)
    cursor_rows = [(int(g.meta["epoch"]), int(g.meta["row"])) for g in scenario["all"]]
    assert len(cursor_rows) == len(set(cursor_rows))
    assert scenario["alive_before_stop"] == {"a", "b", "c"}


def test_a_raising_reward_plugin_scores_zero_but_actors_keep_publishing(scenario):
    for g in scenario["all"]:
        for c in g.completions:
            assert "reward_plugins:raises" not in c.reward_parts
            assert c.reward == pytest.approx(
                sum(v for k, v in c.reward_parts.items() if k.startswith("reverse_digits/"))
            )
    # the failures show in the metrics of each of a and b that scored a group
    publishers = {g.actor_id for g in scenario["first"]} & {"a", "b"}
    assert publishers
    for name in publishers:
        metrics = scenario["metrics"][name]
        assert 'streamrl_actor_reward_failures_total{kind="exception"}' in metrics
        assert "streamrl_actor_groups_published_total" in metrics


def test_sigterm_stops_actors_cleanly_and_a_sigkilled_actor_leaves_nothing_behind(scenario):
    assert scenario["exit_codes"] == {"a": 0, "b": 0, "c": -signal.SIGKILL}
    # a and b deregistered, c's heartbeat expired
    assert scenario["alive_after_stop"] == []
    assert scenario["leases_after_stop"] == 0
    # only the killed one could not unregister
    assert set(scenario["targets_after_stop"]) <= {b"actor:c"}
