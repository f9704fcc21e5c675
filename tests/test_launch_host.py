"""``streamrl actors --join URL --count N``: one host's actors under the run's one supervisor code.

Real actor and relay processes on fake GPU ids (the launcher's CUDA_VISIBLE_DEVICES), read back
from /proc/<pid>/environ: each actor gets its own ``actor.gpus`` entry, a SIGKILLed one comes
back on the same GPU after the supervisor's backoff, the host's scale list resizes them, the
relay comes first when the transport wants one, and everything the host keeps is under its
``run.host_id``.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import psutil
import pytest

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.configs import load_config
from streamrl.launch import placement
from streamrl.launch.control import KEY_FILE, control_key, encode
from streamrl.launch.host import HostSupervisor, host_dir

CONFIG = "configs/demo_cpu.yaml"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_actor_host_places_restarts_and_scales_its_actors_behind_its_relay(
    tmp_path, demo_policy, demo_dataset, redis_server, monkeypatch, capsys
):
    from streamrl.launch.cli import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "90,91")
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    overrides = [
        f"run.name=host-{uuid.uuid4().hex[:8]}",
        f"run.dir={tmp_path / 'run'}",
        f"model.path={demo_policy}",
        f"data.path={demo_dataset}",
        "run.host_id=hostC",
        # the learner's GPU 0 is on its own host: no clash with this host's GPU 0
        "actor.gpus=[0,1]",
        "actor.staggered_start=false",
        "weightsync.transport=dist",
        "weightsync.dist.relay=true",
    ]
    cfg = load_config(CONFIG, overrides)
    sup = HostSupervisor(cfg, actors=2, url=redis_server.url)
    client = connect_sync(cfg.broker, cfg.run.dir)
    keys = Keys.from_config(cfg.run, cfg.broker)
    try:
        sup.start()
        relay = sup.helpers[0]
        assert relay.argv[2] == "streamrl.weightsync.relay" and "--host-id" in relay.argv
        assert relay.proc.pid < min(a.proc.pid for a in sup.actors), "relay not started first"
        envs = {a.name: psutil.Process(a.proc.pid).environ() for a in sup.actors}
        killed = sup.actors[0].proc.pid
        os.kill(killed, signal.SIGKILL)
        assert sup.wait_until(lambda: sup.actors[0].restarts == 1, timeout=30)
        again = psutil.Process(sup.actors[0].proc.pid).environ()
        first_exit = sup.actors[0].exit_codes[0]
        # `streamrl run`'s scale list is not this host's
        key = (host_dir(cfg.run.dir, "hostC") / KEY_FILE).read_bytes().strip()
        client.rpush(keys.launch_control, encode(key, keys.launch_control, 0))
        mine = control_key(keys.launch_control, "hostC")
        client.rpush(mine, encode(key, mine, 3))
        sup.tick()
        sup.tick()
        names_after_scale = [a.name for a in sup.actors]
        recorded = placement.read(host_dir(cfg.run.dir, "hostC"))
        assert (
            main(["scale", "--config", CONFIG, *overrides, "--host", "hostC", "--actors", "1"]) == 0
        )
        sup.tick()
        running = [a.name for a in sup.actors]
    finally:
        sup.stop()
        client.close()
    assert {n: e["CUDA_VISIBLE_DEVICES"] for n, e in envs.items()} == {
        "hostC-a0": "90",
        "hostC-a1": "91",
    }
    assert all(e["REDIS_URL"] == redis_server.url for e in envs.values())
    assert first_exit == -signal.SIGKILL and again["CUDA_VISIBLE_DEVICES"] == "90"
    assert names_after_scale == ["hostC-a0", "hostC-a1", "hostC-a2"]
    assert recorded == {"hostC-a0": "90", "hostC-a1": "91", "hostC-a2": "90"}
    assert running == ["hostC-a0"]
    assert "on host 'hostC' for 1 actors" in capsys.readouterr().out
    # stopped with the actors
    assert relay.done and len(relay.exit_codes) == 1
    home = host_dir(cfg.run.dir, "hostC")
    assert (home / "config.yaml").exists() and (home / "logs" / "actor-hostC-a0.log").exists()
    assert not (Path(cfg.run.dir) / "placement.json").exists()


def test_actors_without_a_broker_to_join_stop_naming_where_one_comes_from(
    tmp_path, redis_server, monkeypatch, capsys
):
    from streamrl.broker.password import PASSWORD_ENV
    from streamrl.launch.cli import main

    monkeypatch.delenv("REDIS_URL", raising=False)
    assert main(["actors", f"run.dir={tmp_path}", "--count", "2"]) == 2
    assert "set REDIS_URL" in capsys.readouterr().err
    assert main(["actors", "--join", "redis://:pw@10.0.0.1:6379/0"]) == 2
    assert "password in the URL" in capsys.readouterr().err
    # a wrong password is refused by the broker before any input is loaded
    monkeypatch.setenv(PASSWORD_ENV, "not-the-password")
    join = f"redis://127.0.0.1:{redis_server.port}/0"
    assert main(["actors", "--join", join, f"run.dir={tmp_path}", "--count", "1"]) == 1
    assert "cannot reach the run's broker" in capsys.readouterr().err
    assert not (tmp_path / "hosts").exists()
