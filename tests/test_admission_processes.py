"""Admission over real processes: the staleness bound holds in a running system, and a learner
that dies between reading entries and counting them leaves the counters balanced."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from learner_rollouts import xadd_groups
from test_learner_processes import ROOT, _config, _env, _overrides, _steps_logged, _stream_of

from bench.chaos import admission_counts
from bench.chaos_checks import admission_violations
from streamrl.broker.cleanup import delete_run_keys
from streamrl.broker.keys import Keys
from streamrl.configs import load_config
from streamrl.launch.status import read_steps
from streamrl.launch.supervisor import Supervisor

CONFIG = "configs/demo_cpu.yaml"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_entries_read_by_a_learner_that_died_before_counting_them_are_counted_once(
    redis_cfg, demo_policy, tmp_path
):
    # The learner's first read got 3 entries off the stream (XREADGROUP) and it died there, or
    # redis-py retried that read after a lost reply: the entries sit in its pending list unnoticed.
    cfg = _config(redis_cfg, demo_policy, redis_cfg.run.name, tmp_path, run={"max_steps": 2})
    keys = Keys.from_config(cfg.run, cfg.broker)
    xadd_groups(cfg, _stream_of(demo_policy, 2, seed=13))
    client = redis.Redis.from_url(cfg.broker.redis_url)
    try:
        client.xgroup_create(keys.stream, cfg.broker.consumer_group, id="0", mkstream=True)
        client.xreadgroup(cfg.broker.consumer_group, "learner-0", {keys.stream: ">"}, count=3)
        _run_learner(cfg)
        assert [r["step"] for r in _steps_logged(cfg)] == [1, 2]
        counts = admission_counts(client, keys)
    finally:
        client.close()
    assert counts.accepted == 8 and counts.stream_length == 0
    assert admission_violations(counts) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_learner_resumed_from_a_checkpoint_older_than_a_redis_wipe_counts_from_zero(
    redis_cfg, demo_policy, tmp_path
):
    # Two steps, checkpointed (adm:consumed 8); then Redis loses the run's data (a restart without
    # persistence), one more step's groups arrive, and the learner resumes from that checkpoint.
    # Its saved count belongs to the lost data set: carried over, `consumed` would exceed `accepted`.
    groups = _stream_of(demo_policy, 3, seed=13)
    first = _config(redis_cfg, demo_policy, redis_cfg.run.name, tmp_path, run={"max_steps": 2})
    resumed = _config(redis_cfg, demo_policy, redis_cfg.run.name, tmp_path, run={"max_steps": 3})
    keys = Keys.from_config(first.run, first.broker)
    client = redis.Redis.from_url(first.broker.redis_url)
    try:
        for cfg, batch in ((first, groups[:8]), (resumed, groups[8:])):
            xadd_groups(cfg, batch)
            _run_learner(cfg)
            if cfg is first:
                assert int(client.get(keys.consumed)) == 8
                delete_run_keys(client, keys)
        assert [r["step"] for r in _steps_logged(resumed)] == [1, 2, 3]
        counts = admission_counts(client, keys)
    finally:
        client.close()
    assert (counts.accepted, counts.consumed, counts.stream_length) == (4, 4, 0)
    assert admission_violations(counts) == []


def _run_learner(cfg) -> None:
    """``python -m streamrl.learner`` on ``cfg`` until it stops by itself (run.max_steps); it must exit 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "streamrl.learner", *_overrides(cfg)],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _bound_violations(client, keys: Keys, cfg) -> list[str]:
    """One atomic snapshot: every live lease's engine version bounds the groups ahead of it."""
    from streamrl.broker.admission import Bounds, lease_version, slots

    pipe = client.pipeline(transaction=True)
    for key in (keys.accepted, keys.consumed, keys.discarded, keys.trimmed, keys.version):
        pipe.get(key)
    pipe.zrange(keys.leases, 0, -1, withscores=True)
    pipe.time()
    *raw, leases, (sec, usec) = pipe.execute()
    accepted, consumed, discarded, trimmed, version = (int(v or 0) for v in raw)
    now_ms = sec * 1000 + usec // 1000
    live = [m.decode() for m, expiry in leases if expiry > now_ms]
    ahead, taken = accepted + len(live), consumed + discarded + trimmed
    out = []
    for lease in live:
        bound = taken + slots(
            lease_version(lease), version, Bounds.from_config(cfg.algo, cfg.learner)
        )
        if ahead > bound:
            out.append(f"{ahead} groups started, bound {bound} for lease {lease} at v{version}")
    return out


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_running_system_starts_no_group_beyond_the_bound_and_trains_no_stale_token(
    tmp_path, demo_policy, demo_dataset
):
    overrides = [
        f"run.name=adm-{uuid.uuid4().hex[:8]}",
        f"run.dir={tmp_path / 'run'}",
        f"model.path={demo_policy}",
        f"data.path={demo_dataset}",
        "run.max_steps=30",
        "run.max_time_s=0",
        # one version per batch, so max_staleness=1 is one batch of look-ahead
        "learner.minibatches=1",
        "algo.max_staleness=1",
    ]
    cfg = load_config(CONFIG, overrides, env={})
    assert cfg.learner.versions_per_batch == 1
    keys = Keys.from_config(cfg.run, cfg.broker)
    run_dir = Path(cfg.run.dir)
    sup = Supervisor(cfg, actors=2)
    violations, snapshots, tokens = [], 0, (0.0, 0.0)
    try:
        sup.start()
        deadline = time.monotonic() + 360
        while not sup.learner_finished:
            assert time.monotonic() < deadline, "the run did not reach max_steps"
            sup.tick()
            violations += _bound_violations(sup.redis, keys, cfg)
            snapshots += 1
            if snapshots % 100 == 0:
                # the learner's endpoint goes once it has stopped: keep the last pair with it
                scraped = _scrape_tokens(sup.redis, keys)
                tokens = scraped if scraped[1] > 0 else tokens
            time.sleep(0.02)
        sup.scale(0)
        counts = admission_counts(sup.redis, keys)
    finally:
        sup.stop()
    assert snapshots > 100 and violations == [], violations[:5]
    rows = read_steps(run_dir)
    assert len([r for r in rows if r["trained"]]) == 30
    # the bound is on tokens as trained: none older than max_staleness, none masked, none dropped
    assert max(r["staleness_max"] for r in rows) <= 1
    assert sum(r["stale_tokens"] for r in rows) == 0
    assert sum(r["dropped_stale_groups"] for r in rows) == 0
    # the actors generated ahead: some tokens were one version old (a real async run)
    assert max(r["staleness_mean"] for r in rows) > 0
    assert admission_violations(counts) == []
    # waste from the actors' and the learner's own counters, scraped during the run
    published, trained = tokens
    assert 0 < trained <= published


def _scrape_tokens(client, keys: Keys) -> tuple[float, float]:
    """Sum of streamrl_actor_tokens_published_total and streamrl_learner_tokens_trained_total
    over every registered metrics endpoint."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    totals = {"streamrl_actor_tokens_published": 0.0, "streamrl_learner_tokens_trained": 0.0}
    # the learner first: what it trained by then was published by then
    targets = sorted(
        client.hgetall(keys.metrics_targets).items(), key=lambda t: b"learner" not in t[0]
    )
    for _, target in targets:
        try:
            with urllib.request.urlopen(f"http://{target.decode()}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            continue
        for family in text_string_to_metric_families(text):
            if family.name in totals:
                totals[family.name] += sum(
                    s.value for s in family.samples if s.name.endswith("_total")
                )
    return totals["streamrl_actor_tokens_published"], totals["streamrl_learner_tokens_trained"]
