"""Nobody but the learner says what a version is: a hostile process on the dist transport's store
port (which answers anyone) writes forged version headers, and a password holder writes broken
heartbeats into Redis; both are refused and counted, the relay's loop lives on, the run's real
versions still arrive, and a relay that restarts gets the current version without a publish.

One learner (host A) and one relay with an actor (host C) in this process over loopback, as in
test_weightsync_relay; the attacker is a process of its own holding a plain TCPStore client.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from prometheus_client import REGISTRY
from test_weightsync_relay import HIDDEN, LAYERS, RelayThread, _cfg, _wait_members
from weightsync_helpers import InProcessActor
from weightsync_procs import learner_tensors

from streamrl.weightsync.hosts import relay_member, relay_stats_key
from streamrl.weightsync.publisher import Publisher
from streamrl.weightsync.transports.dist.trust import Refused, header, sign, verify

pytestmark = pytest.mark.slow

# what the attacker runs: one store client, fed "set KEY HEX" / "copy FROM TO" lines
HOSTILE = """
import datetime, sys, torch.distributed as d
store = d.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False,
                   timeout=datetime.timedelta(seconds=10))
for line in sys.stdin:
    verb, a, b = line.split()
    store.set(a, bytes.fromhex(b) if verb == "set" else store.get(b))
    print("done", flush=True)
"""


class Attacker:
    def __init__(self, port: int):
        self.popen = subprocess.Popen(
            [sys.executable, "-c", HOSTILE, str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _say(self, line: str) -> None:
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()
        assert self.popen.stdout.readline().strip() == "done"

    def set(self, key: str, value: bytes) -> None:
        self._say(f"set {key} {value.hex()}")

    def copy(self, source: str, key: str) -> None:
        self._say(f"copy {key} {source}")

    def close(self) -> None:
        self.popen.stdin.close()
        self.popen.wait(timeout=10)


def _refused(kind: str) -> float:
    return REGISTRY.get_sample_value("streamrl_weights_refused_total", {"kind": kind}) or 0.0


def _forged_body(pub) -> bytes:
    """The learner's own header turned hostile: version 10**9, the layout reordered (the same
    tensors, so the same bytes read as other tensors), checksums to match, and bucket_bytes 0."""
    layout = pub._layout.to_json()
    return json.dumps(
        {
            "version": 10**9,
            "layout": layout[::-1],
            "aliases": {},
            "bucket_bytes": 0,
            "publisher": pub.id,
            "checksums": [0] * len(layout),
        }
    ).encode()


def _wait(done, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_forged_unsigned_and_replayed_headers_on_the_store_port_are_refused_and_counted(
    redis_cfg,
):
    learner, on_c = _cfg(redis_cfg, "hostA"), _cfg(redis_cfg, "hostC")
    pub = Publisher.from_config(learner.weightsync, learner.broker, learner.run)
    relay = RelayThread(on_c)
    actor = InProcessActor(on_c, "c0", HIDDEN, LAYERS)
    attacker = None
    stats = relay_stats_key(pub.keys)

    def refused_by_relay() -> int:
        return int(pub.client.hget(stats, "hostC:refused") or 0)

    try:
        _wait_members(pub, {relay_member("hostC")})
        pub.publish(1, learner_tensors(1, HIDDEN, LAYERS))
        actor.wait_version(1)
        dist = pub._sender.dist
        attacker = Attacker(dist.store.port)
        before = {k: _refused(k) for k in ("unsigned", "forged")}
        body = _forged_body(pub)
        attacks = [
            # the header as it was before headers were signed
            lambda key: attacker.set(key, body),
            # the signed form with a MAC made up
            lambda key: attacker.set(key, b"v1:" + b"0" * 64 + b":" + body),
            # the learner's own signed header of the last version, copied under the next key
            lambda key: attacker.copy(f"e{dist.epoch}/pub/{dist.seq - 1}", key),
        ]
        for n, attack in enumerate(attacks, start=1):
            # the key the relay reads next, written before the learner writes its own there
            attack(f"e{dist.epoch}/pub/{dist.seq}")
            _wait(lambda n=n: refused_by_relay() >= n, f"attack {n} not refused")
            version = 1 + n
            pub.publish(version, learner_tensors(version, HIDDEN, LAYERS))
            actor.wait_version(version)
            relay.wait_served(version)

        assert refused_by_relay() == 3
        assert _refused("unsigned") == before["unsigned"] + 1
        assert _refused("forged") == before["forged"] + 2
        # only the learner's versions were served and applied, each whole, and the relay's loop
        # lives: its thread still serves
        assert relay.served == [1, 2, 3, 4]
        assert actor.applied == [(v, True) for v in range(1, 5)]
        assert actor.sub.version == 4
        assert relay._thread.is_alive()
        assert int(pub.client.hget(stats, "hostC:versions")) == 4
    finally:
        if attacker is not None:
            attacker.close()
        actor.close()
        relay.close()
        pub.close()


def test_a_signed_header_is_still_checked_field_by_field():
    secret, key = b"s" * 32, "e1/pub/0"
    good = {
        "version": 3,
        "layout": [["a", [2, 2], "float32"], ["b", [4], "bfloat16"]],
        "aliases": {"c": "a"},
        "bucket_bytes": 1 << 16,
        "publisher": "p",
        "checksums": [1, 2],
    }
    assert header(verify(secret, key, sign(secret, key, good))).version == 3
    bad = [
        {"bucket_bytes": 0},
        {"bucket_bytes": -1},
        {"bucket_bytes": 1.5},
        {"version": 10**30},
        {"version": -1},
        {"version": True},
        {"version": "7"},
        {"layout": [["a", [2, 2], "float32"], ["a", [4], "float32"]]},
        {"layout": [["a", [-2], "float32"]]},
        {"layout": [["a", [2], "os.system"]]},
        {"layout": []},
        {"layout": "a"},
        {"aliases": {"c": "nowhere"}},
        {"checksums": [1]},
        {"checksums": [1, -2]},
        {"publisher": ["p"]},
    ]
    for change in bad:
        value = verify(secret, key, sign(secret, key, good | change))
        with pytest.raises(Refused) as refused:
            header(value)
        assert refused.value.kind == "malformed", change
    # a signature binds the key it was written under, and the secret of its epoch
    with pytest.raises(Refused, match="forged"):
        verify(secret, "e1/pub/1", sign(secret, key, good))
    with pytest.raises(Refused, match="forged"):
        verify(b"t" * 32, key, sign(secret, key, good))


def test_malformed_and_non_finite_heartbeats_are_dropped_and_counted_never_fatal(redis_cfg):
    learner, on_c = _cfg(redis_cfg, "hostA"), _cfg(redis_cfg, "hostC")
    pub = Publisher.from_config(learner.weightsync, learner.broker, learner.run)
    relay = RelayThread(on_c)
    members = pub.keys.weights_dist_members
    hostile = {
        "words": "not a heartbeat",
        "nan": "nan -1",
        "inf": "inf 0",
        "overflow": "1e999 0",
        "huge-epoch": f"{time.time() + 60} 1e999",
        "empty": "",
        b"\xff\xfe": f"{time.time() + 60} 0",
    }
    try:
        _wait_members(pub, {relay_member("hostC")})
        pub.publish(1, learner_tensors(1, HIDDEN, LAYERS))
        relay.wait_served(1)
        before = _refused("heartbeat")
        pub.client.hset(members, mapping=hostile)
        for version in (2, 3):
            pub.publish(version, learner_tensors(version, HIDDEN, LAYERS))
        relay.wait_served(3)
        assert pub._sender.dist.members == [relay_member("hostC")]
        assert pub.client.hkeys(members) == [relay_member("hostC").encode()]
        assert _refused("heartbeat") == before + len(hostile)
    finally:
        relay.close()
        pub.close()


def test_the_learner_never_invites_the_relay_of_its_own_host(redis_cfg):
    """A relay started beside the learner (``streamrl actors`` on the learner's host) checks in
    before it sees that the learner serves its host itself; the learner leaves it out instead of
    waiting timeout_s for it and dropping it."""
    learner, on_c = _cfg(redis_cfg, "hostA"), _cfg(redis_cfg, "hostC")
    pub = Publisher.from_config(learner.weightsync, learner.broker, learner.run)
    relay = RelayThread(on_c)
    try:
        pub.client.hset(
            pub.keys.weights_dist_members, relay_member("hostA"), f"{time.time() + 600} -1 -1"
        )
        _wait_members(pub, {relay_member("hostA"), relay_member("hostC")})
        pub.publish(1, learner_tensors(1, HIDDEN, LAYERS))
        relay.wait_served(1)
        assert pub._sender.dist.members == [relay_member("hostC")]
        assert pub._sender.dist.dropped == {}
    finally:
        relay.close()
        pub.close()


def test_a_relay_that_restarts_gets_the_current_version_without_a_publish(redis_cfg):
    learner = _cfg(redis_cfg, "hostA")
    on_c, on_d = _cfg(redis_cfg, "hostC"), _cfg(redis_cfg, "hostD")
    pub = Publisher.from_config(learner.weightsync, learner.broker, learner.run)
    relay_c, relay_d = RelayThread(on_c), RelayThread(on_d)
    restarted = actor = None
    stats = relay_stats_key(pub.keys)
    try:
        _wait_members(pub, {relay_member("hostC"), relay_member("hostD")})
        for version in (1, 2, 3):
            pub.publish(version, learner_tensors(version, HIDDEN, LAYERS))
        relay_c.wait_served(3)
        relay_d.wait_served(3)
        relay_c.close()
        # a new relay process on host C: its segment is new, its actors have nothing yet
        restarted = RelayThread(on_c)
        actor = InProcessActor(on_c, "c0", HIDDEN, LAYERS)
        actor.wait_version(3)
        restarted.wait_served(3)
        assert actor.applied == [(3, True)]
        # the resend is all one version: host D, which had it, took it again and dropped it
        assert relay_d.served == [1, 2, 3]
        assert int(pub.client.hget(stats, "hostD:versions")) == 3
        assert int(pub.client.hget(stats, "hostC:versions")) == 4
    finally:
        for thing in (actor, restarted, relay_d):
            if thing is not None:
                thing.close()
        pub.close()
