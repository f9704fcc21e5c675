"""Weights across hosts over ``dist``: the host relay takes each version once and serves its host's
actors from shm, a member that misses the deadline is dropped while the others go on, it comes
back, and the store keeps to its port range and a routable address.

"Hosts" here are ``run.host_id``s in one process (the publisher, relays and actors each in their
own thread, over loopback): what these tests check is the keying by host and the group's
membership; the network namespaces of tests/netns_hosts.py are the multi-host test's.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import psutil
import pytest
from weightsync_helpers import InProcessActor, with_weightsync
from weightsync_procs import learner_tensors

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.broker.netaddr import toward
from streamrl.broker.server import is_loopback
from streamrl.weightsync import relay as relay_module
from streamrl.weightsync.announce import read_announcement
from streamrl.weightsync.hosts import host_keys, relay_member, relay_stats_key
from streamrl.weightsync.publisher import Publisher
from streamrl.weightsync.relay import Relay
from streamrl.weightsync.transports.dist.address import routable
from streamrl.weightsync.transports.dist.group import NoFreePort, bound_store
from streamrl.weightsync.transports.shm.segment import SHM_DIR

HIDDEN, LAYERS = 64, 2


def _cfg(redis_cfg, host_id: str, transport: str = "dist", **dist):
    dist = {
        "relay": True,
        "backend": "gloo",
        "bucket_bytes": 1 << 16,
        "host": "127.0.0.1",
        "port": 0,
        **dist,
    }
    ws = {"transport": transport, "timeout_s": 1.0}
    if transport == "dist":
        ws["dist"] = dist
    cfg = with_weightsync(redis_cfg, **ws)
    return cfg.model_copy(update={"run": cfg.run.model_copy(update={"host_id": host_id})})


class RelayThread:
    """A host's relay stepping in a thread; ``pause`` freezes it (no heartbeat, no collective)."""

    def __init__(self, cfg):
        self.client = connect_sync(cfg.broker, cfg.run.dir)
        keys = Keys.from_config(cfg.run, cfg.broker)
        self.relay = Relay(cfg.weightsync, keys, self.client, cfg.run.host_id)
        self.served: list[int] = []
        self.running = threading.Event()
        self.running.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.running.wait(0.05):
                continue
            try:
                version = self.relay.step(0.05)
            # a collective cut short by the publisher: the relay's own loop logs and goes on too
            except (RuntimeError, OSError):
                continue
            if version is not None:
                self.served.append(version)

    def wait_served(self, version: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.served or self.served[-1] < version:
            assert time.monotonic() < deadline, f"relay served {self.served}, wanted {version}"
            time.sleep(0.01)

    def close(self) -> None:
        self.running.set()
        self._stop.set()
        self._thread.join(timeout=10)
        self.relay.close()
        self.client.close()


def _wait_members(pub, members: set[str], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while {m.decode() for m in pub.client.hkeys(pub.keys.weights_dist_members)} < members:
        assert time.monotonic() < deadline, "members never registered"
        time.sleep(0.02)


def _publish_until(pub, first: int, done, limit: int = 200) -> int:
    """Publish ``first``, ``first + 1``, ... until ``done()``; returns the last version published."""
    for version in range(first, first + limit):
        pub.publish(version, learner_tensors(version, HIDDEN, LAYERS))
        if done():
            return version
        time.sleep(0.02)
    raise AssertionError(f"not done after versions {first}..{first + limit - 1}")


def test_one_relay_per_host_takes_each_version_once_and_serves_every_actor_there(redis_cfg):
    learner = _cfg(redis_cfg, "hostA")
    on_c = _cfg(redis_cfg, "hostC")
    pub = Publisher.from_config(learner.weightsync, learner.broker, learner.run)
    relays = [RelayThread(on_c), RelayThread(learner)]
    actors = [InProcessActor(on_c, f"c{i}", HIDDEN, LAYERS) for i in range(3)]
    beside_learner = InProcessActor(learner, "a0", HIDDEN, LAYERS)
    late = None
    try:
        _wait_members(pub, {relay_member("hostC")})
        for version in range(1, 6):
            pub.publish(version, learner_tensors(version, HIDDEN, LAYERS))
        for actor in [*actors, beside_learner]:
            actor.wait_version(5)
            assert all(ok for _, ok in actor.applied)
        # a late actor on host C takes the newest version from the relay's segment, no publish needed
        late = InProcessActor(on_c, "c-late", HIDDEN, LAYERS)
        late.wait_version(5)
        assert late.applied == [(5, True)]

        # the group holds one member per actor host; the relay beside the learner stays out of it
        assert pub._sender.dist.members == [relay_member("hostC")]
        stats = pub.client.hgetall(relay_stats_key(pub.keys))
        model_bytes = pub._layout.total_bytes
        assert int(stats[b"hostC:versions"]) == 5
        assert int(stats[b"hostC:bytes"]) == 5 * model_bytes
        assert b"hostA:versions" not in stats
        # each host's actors read their own host's segment, announced under their own host's keys
        c_ann = read_announcement(pub.client, host_keys(pub.keys, "hostC"))
        a_ann = read_announcement(pub.client, host_keys(pub.keys, "hostA"))
        assert ".hostC." in c_ann.meta["segment"] and ".hostA." in a_ann.meta["segment"]
        assert c_ann.publisher == a_ann.publisher == pub.id
        # a host without a relay finds nothing: no actor reads another host's segment by accident
        assert read_announcement(pub.client, host_keys(pub.keys, "hostB")) is None
    finally:
        for actor in [*actors, beside_learner, *([late] if late else [])]:
            actor.close()
        for relay in relays:
            relay.close()
        pub.close()


def test_the_relay_stamps_its_slot_with_the_checksums_the_learner_took_on_its_own_bytes(redis_cfg):
    """The learner writes its host's slot piece by piece while the pieces are broadcast, so its
    checksums follow the broadcast (signed): the relay's slot carries them, not sums of what it
    received, and its actors check the bytes end to end against the learner's."""
    learner, on_c = _cfg(redis_cfg, "hostA"), _cfg(redis_cfg, "hostC")
    pub = Publisher.from_config(learner.weightsync, learner.broker, learner.run)
    relay = RelayThread(on_c)
    actor = InProcessActor(on_c, "c0", HIDDEN, LAYERS)
    try:
        _wait_members(pub, {relay_member("hostC")})
        for version in (1, 2):
            pub.publish(version, learner_tensors(version, HIDDEN, LAYERS))
            relay.wait_served(version)
            actor.wait_version(version)
            sender = pub._sender
            learners = sender.shm.writer.checksums(sender._last[2])
            assert relay.relay.receiver.checksums == learners
            assert relay.relay.writer.checksums(relay.relay.slot) == learners
        assert actor.applied == [(1, True), (2, True)]
    finally:
        actor.close()
        relay.close()
        pub.close()


def test_a_frozen_host_is_dropped_within_the_timeout_and_rejoins_when_it_thaws(redis_cfg):
    learner = _cfg(redis_cfg, "hostA")
    timeout_s = learner.weightsync.timeout_s
    pub = Publisher.from_config(learner.weightsync, learner.broker, learner.run)
    healthy, frozen = RelayThread(_cfg(redis_cfg, "hostC")), RelayThread(_cfg(redis_cfg, "hostD"))
    try:
        _wait_members(pub, {relay_member("hostC"), relay_member("hostD")})
        _publish_until(pub, 1, lambda: frozen.served and healthy.served)
        frozen.running.clear()
        time.sleep(0.1)
        # a frozen host first costs publishes up to timeout_s each (its heartbeat is still
        # fresh, or it is invited and does not check in), then none: it is not waited for again
        walls = []
        for version in range(100, 106):
            start = time.monotonic()
            pub.publish(version, learner_tensors(version, HIDDEN, LAYERS))
            walls.append(time.monotonic() - start)
        assert max(walls) < timeout_s + 2.0, walls
        assert pub._sender.dist.members == [relay_member("hostC")]
        healthy.wait_served(105)
        # and once dropped it is not invited again while frozen: no new epoch
        epoch = pub._sender.dist.epoch
        for version in range(106, 109):
            pub.publish(version, learner_tensors(version, HIDDEN, LAYERS))
        assert pub._sender.dist.epoch == epoch

        frozen.running.set()
        _publish_until(pub, 200, lambda: frozen.served and frozen.served[-1] >= 200)
        assert pub._sender.dist.members == [relay_member("hostC"), relay_member("hostD")]
    finally:
        healthy.close()
        frozen.close()
        pub.close()


def test_a_member_that_never_checks_in_costs_one_publish_its_timeout_and_no_more(redis_cfg):
    learner = _cfg(redis_cfg, "hostA")
    timeout_s = learner.weightsync.timeout_s
    pub = Publisher.from_config(learner.weightsync, learner.broker, learner.run)
    healthy = RelayThread(_cfg(redis_cfg, "hostC"))
    ghost = relay_member("hostG")
    members = pub.keys.weights_dist_members
    try:
        _wait_members(pub, {relay_member("hostC")})
        _publish_until(pub, 1, lambda: bool(healthy.served))
        # what a relay that died right after its heartbeat leaves: a fresh entry, nobody behind it
        pub.client.hset(members, ghost, f"{time.time() + 60} -1")
        start = time.monotonic()
        pub.publish(100, learner_tensors(100, HIDDEN, LAYERS))
        waited = time.monotonic() - start
        sender = pub._sender.dist
        assert timeout_s <= waited < timeout_s + 2.0, waited
        assert sender.members == [relay_member("hostC")] and ghost in sender.dropped
        healthy.wait_served(100)
        # not invited again while its heartbeat has not seen the epoch it was dropped from
        epoch = sender.epoch
        pub.publish(101, learner_tensors(101, HIDDEN, LAYERS))
        assert sender.epoch == epoch
        # once it has, it is: a host that comes back joins at the next publish
        pub.client.hset(members, ghost, f"{time.time() + 60} {epoch}")
        pub.publish(102, learner_tensors(102, HIDDEN, LAYERS))
        assert sender.epoch == epoch + 1
        healthy.wait_served(102)
    finally:
        healthy.close()
        pub.close()


def test_the_relay_main_serves_its_host_until_sigterm_then_exits_0(redis_cfg):
    learner = _cfg(redis_cfg, "hostA")
    on_c = _cfg(redis_cfg, "hostC")
    pub = Publisher.from_config(learner.weightsync, learner.broker, learner.run)
    argv = [
        "--host-id",
        "hostC",
        f"run.name={on_c.run.name}",
        f"run.dir={on_c.run.dir}",
        f"broker.redis_url={on_c.broker.redis_url}",
        "metrics.enabled=false",
        *(f"weightsync.{k}={v}" for k, v in on_c.weightsync.model_dump().items() if v is not None),
    ]
    actor = InProcessActor(on_c, "c0", HIDDEN, LAYERS)
    seen: dict = {}

    def drive() -> None:
        # main() owns this thread's signals, as the relay process's own main thread does
        try:
            _wait_members(pub, {relay_member("hostC")})
            _publish_until(pub, 1, lambda: actor.sub.version >= 1)
            seen["segment"] = read_announcement(pub.client, host_keys(pub.keys, "hostC")).meta[
                "segment"
            ]
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:
        code = relay_module.main(argv)
    finally:
        driver.join(timeout=30)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        actor.close()
        pub.close()
    assert code == 0
    # served, and its segment went with it
    assert ".hostC." in seen["segment"] and not (SHM_DIR / seen["segment"]).exists()


def test_the_relay_refuses_a_config_that_needs_none(redis_cfg):
    assert relay_module.wanted(_cfg(redis_cfg, "h").weightsync)
    assert not relay_module.wanted(_cfg(redis_cfg, "h", relay=False).weightsync)
    assert not relay_module.wanted(_cfg(redis_cfg, "h", transport="shm").weightsync)
    assert relay_module.main(["weightsync.transport=dist", "weightsync.dist.relay=false"]) == 2


def _free_run(count: int) -> int:
    """A first port of ``count`` consecutive free loopback ports."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count > 65535:
            continue
        try:
            for port in range(first, first + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise AssertionError("no run of free ports")


def test_the_store_takes_the_first_free_port_of_its_range_and_names_the_key_when_none_is(redis_cfg):
    first = _free_run(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        store = bound_store("127.0.0.1", 1.0, first, 3)
        assert store.port == first + 1
        with pytest.raises(NoFreePort, match=r"weightsync\.dist\.port"):
            bound_store("127.0.0.1", 1.0, first, 2)
        del store
    # the publisher's store comes from weightsync.dist.port/ports
    cfg = _cfg(redis_cfg, "hostA", port=first, ports=3)
    pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
    try:
        pub.publish(1, learner_tensors(1, HIDDEN, LAYERS))
        assert first <= pub._sender.dist.store.port < first + 3
    finally:
        pub.close()


def _non_loopback_addresses() -> set[str]:
    stats = psutil.net_if_stats()
    return {
        a.address
        for name, addresses in psutil.net_if_addrs().items()
        if stats.get(name) is None or stats[name].isup
        for a in addresses
        if a.family == socket.AF_INET and not is_loopback(a.address)
    }


def test_the_default_address_is_the_one_toward_the_broker_and_an_explicit_one_wins(redis_cfg):
    own = _non_loopback_addresses()
    if not own:
        pytest.skip("this host has no interface but loopback")
    # a broker on loopback keeps the run on this host: so does the store
    assert routable("127.0.0.1") == "127.0.0.1"
    # a broker at a routable address (here: this host's own): the address traffic to it leaves from
    peer = sorted(own)[0]
    assert routable(peer) == toward(peer) == peer
    # a broker elsewhere that has no route of its own: the default route's, or an interface's
    assert routable("192.0.2.1") in own
    explicit = _cfg(redis_cfg, "hostA", host=peer)
    pub = Publisher.from_config(explicit.weightsync, explicit.broker, explicit.run)
    try:
        pub.publish(1, learner_tensors(1, HIDDEN, LAYERS))
        assert pub._sender.dist.host == peer
    finally:
        pub.close()
