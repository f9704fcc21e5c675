"""The learner on several nodes: torchrun's command line, the interface gloo/NCCL use, and the
start-up check that every rank sees one run directory (real gloo ranks in two processes)."""

from __future__ import annotations

import multiprocessing as mp
import socket

import psutil
import pytest

from streamrl.broker import netaddr
from streamrl.learner import nodes
from streamrl.learner.nodes import Nodes, NodesError


def _addresses() -> list[tuple[str, str]]:
    """(interface, IPv4 address) of every interface of this host."""
    return [
        (name, a.address)
        for name, addrs in psutil.net_if_addrs().items()
        for a in addrs
        if a.family == socket.AF_INET
    ]


def test_several_nodes_meet_at_the_endpoint_with_this_nodes_routable_address():
    here = Nodes(count=2, rank=1, endpoint="10.77.0.1:29400", run_id="demo", max_restarts=3)
    argv = nodes.torchrun_argv(
        "py", 2, ["--config", "c.yaml", "run.max_steps=5"], here, "10.77.0.2"
    )
    assert argv[:4] == ["py", "-m", "torch.distributed.run", "--nproc-per-node=2"]
    assert {
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.77.0.1:29400",
        "--rdzv-id=demo",
        "--max-restarts=3",
        "--local-addr=10.77.0.2",
        # no interface of this host holds 10.77.0.1: torchrun must not serve the store here
        "--rdzv-conf=is_host=false",
    } <= set(argv)
    assert "--standalone" not in argv
    assert argv[-5:] == ["-m", "streamrl.learner", "--config", "c.yaml", "run.max_steps=5"]
    one = nodes.torchrun_argv("py", 2, [], None, None)
    assert "--standalone" in one and "--max-restarts=0" in one


def test_the_node_that_holds_the_endpoint_serves_the_rendezvous_store():
    name, address = next((n, a) for n, a in _addresses() if not a.startswith("127."))
    here = Nodes(count=2, rank=0, endpoint=f"{address}:29400", run_id="r", max_restarts=0)
    assert "--rdzv-conf=is_host=true" in nodes.torchrun_argv("py", 1, [], here, address)


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
        Nodes(run_id="r", max_restarts=0, **kwargs)


def test_several_nodes_without_an_endpoint_stop_before_torchrun(capsys, monkeypatch):
    from streamrl.learner.__main__ import main

    monkeypatch.delenv("RANK", raising=False)
    assert main(["--nnodes", "2", "--node-rank", "1"]) == 2
    assert "--rdzv-endpoint" in capsys.readouterr().err


def test_gloo_and_nccl_use_the_interface_of_the_route_to_the_endpoint_not_the_host_name():
    # each of this host's addresses routes to itself, over the interface that holds it, whatever
    # the host name resolves to (127.0.1.1 on Debian)
    for name, address in _addresses():
        assert netaddr.route_source(address) == address
        assert nodes.interface_env(address, {}) == {
            "GLOO_SOCKET_IFNAME": name,
            "NCCL_SOCKET_IFNAME": name,
        }
    # what the user set stays
    assert nodes.interface_env("127.0.0.1", {"NCCL_SOCKET_IFNAME": "ib0"}) == {
        "GLOO_SOCKET_IFNAME": "lo"
    }
    assert (
        netaddr.interface_of("192.0.2.254") is None or "192.0.2.254" in dict(_addresses()).values()
    )
    assert netaddr.advertised("0.0.0.0", "127.0.0.1") == "127.0.0.1"
    assert netaddr.advertised("10.1.2.3", "127.0.0.1") == "10.1.2.3"


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
