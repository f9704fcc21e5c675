"""Scale commands, as a hostile peer holding the Redis password writes them: a supervisor drops
every entry that is not a signed, addressed, fresh, bounded integer count, logs it, and goes on
supervising; the operator's signed command on the same list still applies.

A real Redis and a real supervisor (``true`` stands in for the actor program: what is checked is
how many it starts); the peer writes over its own connection, as any host of a run can.
"""

from __future__ import annotations

import json
import shutil

import pytest
import redis

from streamrl.launch import control
from streamrl.launch.supervisor import Supervisor

HOSTILE = [
    b'{"actors": Infinity}',
    b'{"actors": NaN}',
    b'{"actors": 1e999}',
    b'{"actors": 3.0}',
    b'{"actors": "3"}',
    b'{"actors": true}',
    b'{"actors": -1}',
    b'{"actors": [[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]}',
    b"[" * 400 + b"]" * 400,
    b"[" * 100_000,
    b'{"actors": ' + b"9" * 5000 + b"}",
    b"not json",
    b"\xff\xfe",
    b"[]",
    b"null",
    # what `streamrl scale` wrote before commands were signed
    b'{"actors": 3}',
]


@pytest.fixture
def supervisor(redis_cfg, tmp_path):
    cfg = redis_cfg.model_copy(
        update={"actor": redis_cfg.actor.model_copy(update={"max_actors": 4})}
    )
    sup = Supervisor(cfg, actors=0, python=shutil.which("true"))
    sup.log_dir.mkdir(parents=True)
    sup.redis = redis.Redis.from_url(cfg.broker.redis_url, socket_timeout=2)
    sup.scale_key = control.create_key(tmp_path)
    peer = redis.Redis.from_url(cfg.broker.redis_url, socket_timeout=2)
    yield sup, peer
    for child in sup.actors:
        child.proc.wait(timeout=10)
    peer.close()
    sup.redis.close()


def _drain(sup: Supervisor, peer: redis.Redis) -> None:
    while peer.llen(sup.control_key):
        sup._apply_control()


def test_malformed_scale_entries_are_dropped_and_logged_never_fatal(supervisor):
    sup, peer = supervisor
    for raw in HOSTILE:
        peer.rpush(sup.control_key, raw)
    _drain(sup, peer)
    assert sup.actors == [] and sup.want_actors == 0
    dropped = [e for e in sup.events if "dropped scale command" in e]
    assert len(dropped) == len(HOSTILE)
    # a flood is shown by its start only
    assert all(len(line) < 300 for line in dropped)
    # the operator's command after them still applies
    peer.rpush(sup.control_key, control.encode(sup.scale_key, sup.control_key, 2))
    sup._apply_control()
    assert len(sup.actors) == 2 and sup.want_actors == 2


def test_a_command_signed_for_another_list_or_replayed_is_dropped(supervisor, tmp_path):
    sup, peer = supervisor
    other_list = control.control_key(sup.keys.launch_control, "hostB")
    peer.rpush(sup.control_key, control.encode(sup.scale_key, other_list, 3))
    # another host's key (a peer signs with its own)
    peer_key = control.create_key(tmp_path / "run")
    peer.rpush(sup.control_key, control.encode(peer_key, sup.control_key, 3))
    _drain(sup, peer)
    assert sup.actors == []
    applied = control.encode(sup.scale_key, sup.control_key, 1)
    peer.rpush(sup.control_key, applied)
    sup._apply_control()
    assert len(sup.actors) == 1
    # the same entry again, or an older signed one, is a replay
    older = json.loads(applied)["at"] - 1
    peer.rpush(sup.control_key, applied, control.encode(sup.scale_key, sup.control_key, 0, older))
    _drain(sup, peer)
    assert len(sup.actors) == 1
    assert sum("a replay" in e for e in sup.events) == 2
    assert sum("not signed with this supervisor's key" in e for e in sup.events) == 2


def test_a_signed_count_past_max_actors_is_clamped(supervisor):
    sup, peer = supervisor
    peer.rpush(sup.control_key, control.encode(sup.scale_key, sup.control_key, 10**30))
    sup._apply_control()
    assert len(sup.actors) == 4 and any("clamped" in e for e in sup.events)


def test_the_supervisors_key_is_its_users_only(tmp_path):
    control.create_key(tmp_path)
    assert (tmp_path / control.KEY_FILE).stat().st_mode & 0o077 == 0
