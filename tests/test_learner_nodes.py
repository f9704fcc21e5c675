"""The learner on several nodes: torchrun's static rendezvous command line, the address node 0 is
reached at (Debian's 127.0.1.1 included), the rendezvous id from the broker, the start-up warning,
fresh process-group keys for each incarnation of the ranks, and the start-up check that every rank
sees one run directory (real gloo ranks in two processes)."""

from __future__ import annotations

import multiprocessing as mp
import socket
import threading
from datetime import timedelta

import psutil
import pytest
import torch.distributed as dist

from streamrl.broker import netaddr
from streamrl.broker.keys import Keys
from streamrl.learner import nodes
from streamrl.learner.nodes import HostView, Nodes, NodesError, Placement, choose_address

ETH = {"127.0.0.1": "lo", "10.77.0.1": "eth0"}
TWO = {"127.0.0.1": "lo", "10.77.0.1": "eth0", "172.17.0.1": "docker0"}


def _addresses() -> list[tuple[str, str]]:
    """(interface, IPv4 address) of every interface of this host."""
    return [
        (name, a.address)
        for name, addrs in psutil.net_if_addrs().items()
        for a in addrs
        if a.family == socket.AF_INET
    ]


def _node(rank: int, endpoint: str = "A:29400") -> Nodes:
    return Nodes(count=2, rank=rank, endpoint=endpoint, max_restarts=3)


def test_several_nodes_meet_through_static_rendezvous_at_node_0s_address():
    here = Placement("10.77.0.2", "eth0", "10.77.0.1")
    argv = nodes.torchrun_argv(
        "py", 2, ["--config", "c.yaml", "run.max_steps=5"], _node(1), here, "f00d"
    )
    assert argv == [
        "py", "-m", "streamrl.learner.torchrun", "--nproc-per-node=2",
        "--nnodes=2", "--node-rank=1", "--rdzv-backend=static",
        "--rdzv-endpoint=10.77.0.1:29400", "--rdzv-id=f00d", "--max-restarts=3",
        "-m", "streamrl.learner", "--config", "c.yaml", "run.max_steps=5",
    ]  # fmt: skip
    one = nodes.torchrun_argv("py", 2, [])
    assert "--standalone" in one and "--max-restarts=0" in one


@pytest.mark.parametrize(
    ("rank", "endpoint", "view", "expected"),
    [
        # node 0 named by an address it holds
        (0, "10.77.0.1:29400", HostView("10.77.0.1", ETH), ("10.77.0.1", "eth0", "10.77.0.1")),
        # Debian: node 0's name is 127.0.1.1 there; its route to the broker says which address
        (0, "A:29400", HostView("127.0.1.1", TWO, broker_route="10.77.0.1"),
         ("10.77.0.1", "eth0", "10.77.0.1")),
        # ... the broker on loopback: its one routable address
        (0, "A:29400", HostView("127.0.1.1", ETH, broker_route="127.0.0.1"),
         ("10.77.0.1", "eth0", "10.77.0.1")),
        # ... several: the one GLOO_SOCKET_IFNAME names
        (0, "A:29400", HostView("127.0.1.1", TWO, named=("docker0",)),
         ("172.17.0.1", "docker0", "172.17.0.1")),
        # every node on this host
        (0, "127.0.0.1:29400", HostView("127.0.0.1", ETH), ("127.0.0.1", "lo", "127.0.0.1")),
        (1, "localhost:29400", HostView("127.0.0.1", ETH, endpoint_route="127.0.0.1"),
         ("127.0.0.1", "lo", "127.0.0.1")),
        # node 1: the source of its route to node 0, which it reaches at the resolved address
        (1, "A:29400", HostView("10.77.0.1", {"10.77.0.2": "eth1"}, endpoint_route="10.77.0.2"),
         ("10.77.0.2", "eth1", "10.77.0.1")),
    ],
)  # fmt: skip
def test_each_node_is_reached_at_an_address_the_others_route_to(rank, endpoint, view, expected):
    assert choose_address(_node(rank, endpoint), view) == Placement(*expected)


@pytest.mark.parametrize(
    ("rank", "view", "message"),
    [
        # Debian, broker on loopback, two routable addresses: no guess
        (0, HostView("127.0.1.1", TWO, broker_route="127.0.0.1"),
         r"--rdzv-endpoint A:29400: A resolves to 127\.0\.1\.1 on node 0.*"
         r"give --rdzv-endpoint as that address, or set GLOO_SOCKET_IFNAME"),
        # node 0 must serve the store at the endpoint
        (0, HostView("10.77.0.9", ETH), r"--node-rank 0 serves the rendezvous at --rdzv-endpoint"),
        # a name that is loopback on node 1 is not node 0's
        (1, HostView("127.0.1.1", ETH, endpoint_route="127.0.0.1"),
         r"A resolves to 127\.0\.1\.1 on node 1, which is not node 0"),
        (1, HostView("10.77.0.1", ETH), r"--rdzv-endpoint A:29400: no route to 10\.77\.0\.1"),
    ],
)  # fmt: skip
def test_a_node_that_cannot_be_placed_stops_naming_the_option(rank, view, message):
    with pytest.raises(NodesError, match=message):
        choose_address(_node(rank), view)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"count": 2, "rank": 2, "endpoint": "h:1"}, "--node-rank 2"),
        ({"count": 0, "rank": 0, "endpoint": "h:1"}, "--nnodes 0"),
        ({"count": 2, "rank": 0, "endpoint": "h"}, "host:port"),
        ({"count": 2, "rank": 0, "endpoint": "h:99999"}, "host:port"),
    ],
)
def test_bad_node_options_are_refused_naming_the_option(kwargs, message):
    with pytest.raises(NodesError, match=message):
        Nodes(max_restarts=0, **kwargs)


def test_several_nodes_without_an_endpoint_stop_before_torchrun(capsys, monkeypatch):
    from streamrl.learner.__main__ import main

    monkeypatch.delenv("RANK", raising=False)
    assert main(["--nnodes", "2", "--node-rank", "1"]) == 2
    assert "--rdzv-endpoint" in capsys.readouterr().err


def test_gloo_and_nccl_use_the_interface_of_this_nodes_address_not_the_host_name():
    # each of this host's addresses routes to itself, over the interface that holds it, whatever
    # the host name resolves to (127.0.1.1 on Debian)
    for name, address in _addresses():
        assert netaddr.route_source(address) == address
        view = nodes.host_view(_node(0, f"{address}:29400"), None, {})
        placement = choose_address(_node(0, f"{address}:29400"), view)
        assert nodes.interface_env(placement, {}) == {
            "GLOO_SOCKET_IFNAME": name,
            "NCCL_SOCKET_IFNAME": name,
        }
    # what the user set stays
    lo = Placement("127.0.0.1", "lo", "127.0.0.1")
    assert nodes.interface_env(lo, {"NCCL_SOCKET_IFNAME": "ib0"}) == {"GLOO_SOCKET_IFNAME": "lo"}
    assert netaddr.advertised("0.0.0.0", "127.0.0.1") == "127.0.0.1"
    assert netaddr.advertised("10.1.2.3", "127.0.0.1") == "10.1.2.3"


def test_the_rendezvous_id_is_random_per_run_kept_in_the_broker_and_the_same_for_every_node(
    redis_server,
):
    import redis

    client = redis.Redis.from_url(redis_server.url)
    first, other = Keys("rdzv-a"), Keys("rdzv-b")
    drawn = nodes.rendezvous_id(client, first.learner_rdzv)
    # every node, and a later start of the same run, reads the one node 0 (or whoever came first) drew
    assert nodes.rendezvous_id(client, first.learner_rdzv) == drawn
    assert client.get("streamrl:rdzv-a:learner:rdzv") == drawn.encode()
    assert len(drawn) == 32 and "rdzv-a" not in drawn
    assert nodes.rendezvous_id(client, other.learner_rdzv) != drawn


def test_nodes_meeting_over_a_network_warn_once_unless_the_network_is_trusted():
    routable = Placement("10.77.0.1", "eth0", "10.77.0.1")
    warning = nodes.exposure_warning(_node(0), routable, trusted=False)
    assert "WARNING" in warning and "TCPStore" in warning and "port 29400" in warning
    assert "gloo/NCCL" in warning and "every interface" in warning
    assert "learner.trusted_network=true" in warning and "docs/multihost.md" in warning
    assert nodes.exposure_warning(_node(0), routable, trusted=True) is None
    loopback = Placement("127.0.0.1", "lo", "127.0.0.1")
    assert nodes.exposure_warning(_node(0, "127.0.0.1:29400"), loopback, trusted=False) is None


def test_node_0_starts_torchrun_with_the_brokers_rendezvous_id_after_one_warning(
    redis_server, tmp_path, monkeypatch, capsys
):
    from streamrl.learner import __main__ as learner_main

    name, address = next(
        ((n, a) for n, a in _addresses() if not a.startswith("127.")), (None, None)
    )
    if not name:
        pytest.skip("this host has no routable IPv4 address")
    started = {}
    monkeypatch.setattr(
        learner_main.os, "execve", lambda _p, argv, env: started.update(argv=argv, env=env)
    )
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    for var in ("RANK", *nodes.IFNAME_VARS):
        monkeypatch.delenv(var, raising=False)
    argv = ["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", f"{address}:29400",
            "run.name=rdzv-main", f"run.dir={tmp_path}"]  # fmt: skip
    learner_main.main(argv)
    drawn = Keys("rdzv-main")
    import redis

    rdzv_id = redis.Redis.from_url(redis_server.url).get(drawn.learner_rdzv).decode()
    assert f"--rdzv-id={rdzv_id}" in started["argv"]
    assert "--rdzv-backend=static" in started["argv"] and "--node-rank=0" in started["argv"]
    assert started["env"]["GLOO_SOCKET_IFNAME"] == name
    assert capsys.readouterr().err.count("WARNING") == 1
    learner_main.main([*argv, "learner.trusted_network=true"])
    assert "WARNING" not in capsys.readouterr().err


def test_each_incarnation_of_the_ranks_forms_its_group_under_fresh_keys():
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30), wait_for_workers=False)
    wait = timedelta(seconds=30)
    first = [nodes.generation_store(store, rank, wait) for rank in (0, 1)]
    first[0].set("address", "dead rank 0")
    # rank 1 restarts first: it waits for rank 0's next incarnation, not its dead address; on a
    # connection of its own, as a rank's process has (a client blocked in wait holds its socket)
    client = dist.TCPStore("127.0.0.1", store.port, 1, False, wait)
    second = {}
    rank1 = threading.Thread(
        target=lambda: second.update({1: nodes.generation_store(client, 1, wait)})
    )
    rank1.start()
    second[0] = nodes.generation_store(store, 0, wait)
    rank1.join(30)
    second[0].set("address", "live rank 0")
    assert second[1].get("address") == b"live rank 0"
    assert first[1].get("address") == b"dead rank 0"
    # a rank whose rank 0 never comes back gives up after the timeout (then torchrun's restarts)
    with pytest.raises(dist.DistStoreError):
        nodes.generation_store(store, 1, timedelta(seconds=1))


def _rank(rank: int, store_path: str, roots: list[str], out) -> None:
    import torch
    import torch.distributed as dist

    from streamrl.learner.checkpoint import CheckpointDirNotShared, check_shared

    if dist.is_initialized():
        # forked from a pytest process whose earlier tests ran a learner of one
        dist.destroy_process_group()
    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    said = []
    for root in roots:
        try:
            check_shared(root.format(rank=rank), rank, 2, torch.device("cpu"), f"host{rank}")
            said.append("ok")
        except CheckpointDirNotShared as exc:
            said.append(str(exc))
    dist.destroy_process_group()
    out.put((rank, said))


def test_every_rank_fails_at_start_when_the_ranks_do_not_share_the_run_directory(tmp_path):
    # fork: the ranks start with torch already imported (a spawned one imports it again, seconds)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    # one directory for both ranks, then one of their own each (nodes without a shared filesystem)
    roots = [str(tmp_path / "shared"), str(tmp_path / "node{rank}")]
    ranks = [
        ctx.Process(target=_rank, args=(r, str(tmp_path / "store"), roots, out)) for r in (0, 1)
    ]
    for p in ranks:
        p.start()
    said = dict(out.get(timeout=60) for _ in ranks)
    for p in ranks:
        p.join(30)
    assert said[0][0] == said[1][0] == "ok"
    for rank in (0, 1):
        message = said[rank][1]
        other = 1 - rank
        assert f"rank {rank} on host{rank} does not see rank(s) {other} (host{other})" in message
        assert "filesystem every learner node" in message
    # the probes of the shared check are gone
    assert not any((tmp_path / "shared" / ".shared-probe").iterdir())
