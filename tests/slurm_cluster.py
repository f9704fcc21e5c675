"""A Slurm cluster on one machine: Debian's slurmctld and one slurmd per namespace host.

The hosts are tests/netns_hosts.py's network namespaces. A host ``ctl`` (the login and controller
node) runs ``slurmctld`` and the clients (``sbatch``, ``squeue``, ``scancel``); every other host
runs its own ``slurmd`` inside its namespace and under its own hostname, so each is a node with
its own address, as on a cluster, and the job steps it starts live in that host's namespaces.
One ``munged`` on ``ctl`` (its own key and socket, nothing of the system's) authenticates them
all: its socket is a file, reachable from every network namespace. Everything runs in the hosts'
namespaces, so it all ends with them.

No cgroups, no accounting (``proctrack/linuxproc``, ``task/none``): what a container grants.
Nodes declare 8 GPUs each (gres whose device files are /dev/null's stand-ins), so a script
asking for ``--gpus-per-node`` is scheduled; nothing binds them. Files live in a folder outside ``/tmp`` and ``/dev/shm``, which hosts may
hold privately.

Needs root, iproute2 and Debian's slurmctld, slurmd, slurm-client and munge (``make slurm``);
``available()`` says why not otherwise.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import netns_hosts
import pytest
from netns_hosts import Host

CONTROLLER = "ctl"
PARTITION = "streamrl"
GPUS_PER_NODE = 8
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol")
# slurmd 22.05 loads a cgroup plugin whatever else is configured; v1's loads without a hierarchy
CGROUP_CONF = "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n"


def available() -> str | None:
    """None when a cluster can be made here, else why not (for a skip message)."""
    why = netns_hosts.available()
    if why is not None:
        return why
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    return f"{', '.join(missing)} not installed (make slurm)" if missing else None


def require() -> None:
    """Skip where no cluster can be made here; fail instead under ``STREAMRL_REQUIRE_NETNS``
    (CI, which can make one)."""
    why = available()
    if why is not None:
        (pytest.fail if os.environ.get("STREAMRL_REQUIRE_NETNS") else pytest.skip)(
            f"a Slurm cluster needs: {why}"
        )


def slurm_conf(folder: Path, controller: Host, nodes: Sequence[Host], cpus: int) -> str:
    """slurm.conf: root runs everything, nothing is tracked but the process tree."""
    node_lines = "".join(
        f"NodeName={h.name} NodeAddr={h.address} CPUs={cpus} Gres=gpu:{GPUS_PER_NODE} "
        "State=UNKNOWN\n"
        for h in nodes
    )
    return f"""ClusterName=streamrl
SlurmctldHost={controller.name}({controller.address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder / "munge.socket"}
StateSaveLocation={folder / "state"}
SlurmdSpoolDir={folder / "spool"}/%n
SlurmctldPidFile={folder / "slurmctld.pid"}
SlurmdPidFile={folder / "slurmd-%n.pid"}
SlurmctldLogFile={folder / "slurmctld.log"}
SlurmdLogFile={folder / "slurmd-%n.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
SchedulerParameters=bf_interval=1
MessageTimeout=30
{node_lines}PartitionName={PARTITION} Nodes={",".join(h.name for h in nodes)} MaxTime=INFINITE State=UP
"""


@dataclass
class Cluster:
    """The running cluster: its hosts by name, the controller host, and the clients' env."""

    hosts: dict[str, Host]
    controller: Host
    folder: Path
    env: dict[str, str]

    def client(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """A Slurm client command, run on the controller (the login node)."""
        env = {**self.env, **kwargs.pop("env", {})}
        return self.controller.run(
            argv, env=env, capture_output=True, text=True, check=True, **kwargs
        )

    def job_state(self, job_id: str) -> str:
        """The job's state as the controller knows it (``COMPLETED``, ``CANCELLED``...)."""
        out = self.client(["scontrol", "-o", "show", "job", job_id]).stdout
        states = {f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")}
        return ",".join(sorted(states))

    def logs(self) -> str:
        return "".join(
            f"\n--- {p.name}\n" + p.read_text(errors="replace")[-3000:]
            for p in sorted(self.folder.glob("*.log"))
        )


def _gres_conf(folder: Path) -> str:
    """Slurm drops a GPU without a device file: /dev/null's stand in for the devices."""
    for i in range(GPUS_PER_NODE):
        os.mknod(folder / f"gpu{i}", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    return f"Name=gpu File={folder}/gpu[0-{GPUS_PER_NODE - 1}]\n"


def _munged(host: Host, folder: Path) -> None:
    """munged on ``host``, with a key of its own; its socket (a file) serves every host."""
    key, socket = folder / "munge.key", folder / "munge.socket"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    host.popen(
        ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={socket}",
         f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
         f"--seed-file={folder / 'munged.seed'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not socket.exists():
        assert time.monotonic() < deadline, (folder / "munged.log").read_text(errors="replace")
        time.sleep(0.1)


def _wait_nodes_idle(cluster: Cluster, count: int, timeout: float = 60.0) -> None:
    """Until every node has registered with slurmctld and is idle."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.controller.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], env=cluster.env, capture_output=True, text=True
        ).stdout
        idle = [line for line in out.splitlines() if line.split()[-1:] == ["idle"]]
        if len(idle) == count:
            return
        assert time.monotonic() < deadline, f"nodes not idle: {out!r}\n{cluster.logs()}"
        time.sleep(0.5)


@contextmanager
def cluster(names: Sequence[str] = ("A", "B", "C")) -> Iterator[Cluster]:
    """Nodes ``names`` with a slurmd each and a controller host; all stopped at exit."""
    folder = Path(tempfile.mkdtemp(prefix="streamrl-slurm-", dir="/var/tmp"))
    folder.chmod(0o755)
    for sub in ("state", *(f"spool/{name}" for name in names)):
        (folder / sub).mkdir(parents=True)
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    try:
        with netns_hosts.hosts([*names, CONTROLLER]) as h:
            controller = h.pop(CONTROLLER)
            nodes = [h[name] for name in names]
            (folder / "slurm.conf").write_text(
                slurm_conf(folder, controller, nodes, os.cpu_count() or 1)
            )
            (folder / "gres.conf").write_text(_gres_conf(folder))
            (folder / "cgroup.conf").write_text(CGROUP_CONF)
            made = Cluster(h, controller, folder, env)
            _munged(controller, folder)
            controller.popen(["slurmctld", "-D", "-i"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
            for node in nodes:
                node.popen(["slurmd", "-D", "-N", node.name], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)  # fmt: skip
            _wait_nodes_idle(made, len(nodes))
            yield made
    finally:
        shutil.rmtree(folder, ignore_errors=True)
