"""The torch.distributed transport on gloo with real subscriber processes: versions arrive whole, actors
join between versions, and a killed or frozen actor is dropped without stalling the learner past timeout_s."""

from __future__ import annotations

import signal
import time

import pytest
from weightsync_helpers import InProcessActor, Proc, with_weightsync
from weightsync_procs import learner_tensors

from streamrl.weightsync.publisher import Publisher

pytestmark = pytest.mark.slow


def _cfg(redis_cfg, **dist):
    dist = {"backend": "gloo", "bucket_bytes": 1 << 16, **dist}
    return with_weightsync(redis_cfg, transport="dist", timeout_s=2.0, dist=dist)


def _wait_members(pub, n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while len(pub.client.hkeys(pub.keys.weights_dist_members)) < n:
        assert time.monotonic() < deadline, "subscribers never registered"
        time.sleep(0.05)


def test_versions_broadcast_in_buckets_arrive_whole_and_late_joiners_join_between_versions(
    redis_cfg, procs
):
    cfg = _cfg(redis_cfg)
    subs = [Proc("subscriber", cfg, id=f"p{i}", until=30) for i in range(2)]
    procs.extend(subs)
    pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
    _wait_members(pub, 2)
    late = None
    try:
        for version in range(31):
            # one 64 KiB bucket
            pub.publish(version, learner_tensors(version, 64, 2))
            if version == 10:
                late = InProcessActor(cfg, "late", 64, 2)
                _wait_members(pub, 3)
            time.sleep(0.02)
        for sub in subs:
            sub.wait_event("done")
            versions = [e["version"] for e in sub.applied]
            assert all(e["ok"] for e in sub.applied)
            assert versions == sorted(set(versions)) and versions[-1] == 30
        late.wait_version(30)
        assert all(ok for _, ok in late.applied) and late.applied[0][0] > 10
    finally:
        if late is not None:
            late.close()
        pub.close()


def test_tensors_larger_than_a_bucket_are_split_and_reassembled(redis_cfg):
    cfg = _cfg(redis_cfg, bucket_bytes=1 << 16)
    pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
    # 256x256 fp32 = 256 KiB per tensor: each spans 4+ buckets
    actor = InProcessActor(cfg, "solo", 256, 2)
    try:
        _wait_members(pub, 1)
        for version in range(1, 4):
            pub.publish(version, learner_tensors(version, 256, 2))
        actor.wait_version(3)
        assert actor.applied and all(ok for _, ok in actor.applied)
    finally:
        actor.close()
        pub.close()


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP])
def test_killed_or_frozen_actor_is_dropped_and_the_others_keep_receiving(redis_cfg, procs, signum):
    cfg = _cfg(redis_cfg)
    timeout_s = cfg.weightsync.timeout_s
    victim = Proc("subscriber", cfg, id="victim", until=10**6, duration=60)
    procs.append(victim)
    pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
    witness = InProcessActor(cfg, "witness", 64, 2)
    try:
        _wait_members(pub, 2)
        pub.publish(0, learner_tensors(0, 64, 2))
        pub.publish(1, learner_tensors(1, 64, 2))
        victim.wait_event("applied", version=1)
        victim.signal(signum)
        worst = 0.0
        for version in range(2, 7):
            start = time.monotonic()
            pub.publish(version, learner_tensors(version, 64, 2))
            worst = max(worst, time.monotonic() - start)
        # a dead peer fails the broadcast at once; a frozen one costs at most the heartbeat expiry,
        # a failed broadcast and a rendezvous wait, each bounded by timeout_s
        assert worst < 4 * timeout_s + 2
        witness.wait_version(6)
        assert all(ok for _, ok in witness.applied)
        assert "victim" not in pub._sender.members
        if signum == signal.SIGSTOP:
            victim.signal(signal.SIGCONT)
            # it rejoins at a later epoch
            for version in range(7, 40):
                pub.publish(version, learner_tensors(version, 64, 2))
                if victim.applied and victim.applied[-1]["version"] >= 7:
                    break
                time.sleep(0.1)
            assert victim.applied[-1]["version"] >= 7
            assert all(e["ok"] for e in victim.applied)
    finally:
        witness.close()
        pub.close()


def _listening(pid: int) -> set[str]:
    import psutil

    return {
        c.laddr.ip
        for c in psutil.Process(pid).net_connections("inet")
        if c.status == psutil.CONN_LISTEN
    }


def test_the_rendezvous_store_and_the_group_listen_on_dist_host_only(redis_cfg, procs):
    import os

    cfg = _cfg(redis_cfg, host="127.0.0.1")
    sub = Proc("subscriber", cfg, id="bind", until=3)
    procs.append(sub)
    before = _listening(os.getpid())
    pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
    _wait_members(pub, 1)
    try:
        pub.publish(0, learner_tensors(0, 64, 2))
        # While the group is up: the publisher's store and gloo pairs, the subscriber's gloo pairs.
        opened = (_listening(os.getpid()) - before) | _listening(sub.popen.pid)
        for version in range(1, 4):
            pub.publish(version, learner_tensors(version, 64, 2))
        sub.wait_event("done")
        assert all(e["ok"] for e in sub.applied)
        assert opened and opened <= {"127.0.0.1"}, f"listening on {opened}"
    finally:
        pub.close()
