"""Two learner nodes on this host (loopback) under torchrun's static rendezvous, as
``streamrl learner --nnodes 2`` starts them, with a small worker in place of the learner that
joins its group as the learner does (``learner.nodes.init_process_group``): the node called
``--node-rank 0`` holds global rank 0, and after one node's worker is SIGKILLed every node's
torchrun restarts its ranks once and they meet again, although rank 0 is busy mid-step when it
happens (without fresh keys per incarnation, the restarted rank dialled the dead rank 0's address
and both hung until the process group's 30-minute timeout)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrl.broker.server import free_port
from streamrl.learner import nodes

pytestmark = pytest.mark.slow

WORKER = """
import os, sys, time
from datetime import timedelta
from pathlib import Path
import torch, torch.distributed as dist
from streamrl.learner import nodes

out = Path(sys.argv[1])
nodes.init_process_group("gloo", timedelta(minutes=2))
rank, attempt = dist.get_rank(), os.environ["TORCHELASTIC_RESTART_COUNT"]
(out / f"up-{rank}-{attempt}").write_text(f"{os.environ['GROUP_RANK']} {os.getpid()}")
while True:
    # rank 0 says when to stop, in the collective itself, so no rank leaves the other waiting
    stop = torch.tensor([float(rank == 0 and (out / f"stop-{attempt}").exists())])
    dist.all_reduce(stop)
    if stop.item():
        break
    # rank 0 is mid-step when the other node's worker dies
    time.sleep(8.0 if rank == 0 else 0.05)
dist.destroy_process_group()
"""


def _wait_for(path: Path, procs, timeout: float = 180) -> str:
    """A hang guard, not a speed bound."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        for p in procs:
            assert p.poll() is None, f"a torchrun exited ({p.returncode}) waiting for {path.name}"
        assert time.monotonic() < deadline, f"timed out waiting for {path.name}"
        time.sleep(0.2)
    return path.read_text()


@pytest.mark.timeout(400)
def test_a_killed_nodes_ranks_restart_and_meet_node_0s_again_with_rank_0_on_node_0(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    endpoint = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    torchruns = []
    for rank in (0, 1):
        argv = nodes.torchrun_argv(
            sys.executable, 1, [], nodes.Nodes(2, rank, endpoint, max_restarts=1),
            nodes.Placement("127.0.0.1", "lo", "127.0.0.1"), "0123abcd",
        )  # fmt: skip
        # the worker script in place of ``-m streamrl.learner``
        argv = [*argv[: argv.index("-m", 3)], str(tmp_path / "worker.py"), str(tmp_path)]
        log = open(tmp_path / f"node{rank}.log", "w")
        torchruns.append(
            subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        )
    try:
        # global rank 0 is the node named --node-rank 0
        assert _wait_for(tmp_path / "up-0-0", torchruns).split()[0] == "0"
        victim = int(_wait_for(tmp_path / "up-1-0", torchruns).split()[1])
        os.kill(victim, signal.SIGKILL)
        # both nodes restart their ranks once, and they meet again (the first all_reduce after
        # init needs both; up-R-1 is written after init)
        for rank in (0, 1):
            _wait_for(tmp_path / f"up-{rank}-1", torchruns)
        (tmp_path / "stop-1").touch()
        assert [p.wait(120) for p in torchruns] == [0, 0], "".join(
            (tmp_path / f"node{r}.log").read_text()[-3000:] for r in (0, 1)
        )
    finally:
        for p in torchruns:
            if p.poll() is None:
                p.kill()
                p.wait()
