"""Weights across hosts: the host relay against a raw gloo broadcast of the same bytes, and the bytes
one actor host's link carries per version, on network-namespace hosts (``tests/netns_hosts.py``;
needs root, as CI has).

    python -m bench.weightsync_hosts [--params N] [--out FILE]   (also part of `--only weightsync`)

Host A runs Redis and the learner's publisher (``weightsync.transport=dist``, ``dist.relay=true``, the
default ``dist.host``); host C runs the relay (``python -m streamrl.weightsync.relay``) and 1 or 4
actor processes reading it through the actor's own feed. *relay ms* = publish start on A -> the
relay on C has the version in its shm segment, announced (its announcement's timestamp; one
machine, one clock). *gloo ms* = a bare two-process gloo broadcast of the same bytes in 64 MiB
buckets from A to C, until C holds them, one round before each version (so a shared machine's
load weighs on both alike). *link bytes* = host C's eth0 receive counter over the versions (the
gloo rounds left out), per version, over one model's bytes (frames with their Ethernet/IP/TCP
headers and the Redis traffic included; the relay's own count is exact). The split table: when
each phase of a version ended on A (the learner's ``HostSender.marks``) and on C (the relay's
``DistReceiver.marks``).

    python -m bench.weightsync_hosts relay|learner|actor|gloo ...   (the bench's own processes)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CHUNK = 4 << 20
BUCKET = 64 << 20
ROUNDS = 8
TESTS = Path(__file__).resolve().parents[1] / "tests"


def _emit(**event) -> None:
    print(json.dumps(event), flush=True)


def _weights(params: int) -> dict[str, torch.Tensor]:
    return {
        f"layer{i}": torch.full((min(CHUNK, params - s),), float(i))
        for i, s in enumerate(range(0, params, CHUNK))
    }


def _cfg(url: str, host_id: str):
    from streamrl.configs.schema import Config

    return Config.model_validate(
        {
            "run": {"name": "bench-hosts", "dir": tempfile.gettempdir(), "host_id": host_id},
            "broker": {"redis_url": url},
            "weightsync": {
                "transport": "dist",
                "dist": {"relay": True, "backend": "gloo", "bucket_bytes": BUCKET},
                "timeout_s": 60,
            },
            "metrics": {"enabled": False},
        }
    )


def learner_main(address: str, params: int) -> None:
    """Host A: Redis on ``address``, then one publish per ``publish V`` line on stdin."""
    from streamrl.broker.server import EmbeddedRedis
    from streamrl.configs.schema import BrokerConfig
    from streamrl.weightsync.announce import read_announcement
    from streamrl.weightsync.hosts import host_keys
    from streamrl.weightsync.publisher import Publisher

    broker = BrokerConfig(host=address, password="bench-" + os.urandom(8).hex())
    with EmbeddedRedis(broker, Path(tempfile.mkdtemp(prefix="bench-hosts-"))) as server:
        cfg = _cfg(server.url_for(address), "A")
        pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
        relayed = host_keys(pub.keys, "C")
        weights = _weights(params)
        _emit(event="redis", url=cfg.broker.redis_url)
        for line in sys.stdin:
            command = line.split()
            if command[0] == "members":
                while len(pub.client.hkeys(pub.keys.weights_dist_members)) < int(command[1]):
                    time.sleep(0.05)
                _emit(event="members")
            elif command[0] == "publish":
                version = int(command[1])
                started = time.time()
                pub.publish(version, weights)
                while (ann := read_announcement(pub.client, relayed)) is None or (
                    ann.version < version
                ):
                    time.sleep(0.001)
                _emit(
                    event="published",
                    relay_s=ann.published_at - started,
                    host=pub._sender.dist.host,
                    bytes=pub._layout.total_bytes,
                    marks={"publish": started, **pub._sender.marks},
                )
            elif command[0] == "quit":
                break
        pub.close()


def actor_main(url: str, actor_id: str, params: int) -> None:
    """Host C: an actor's weight path (the feed picks the relay's shm), applying every version."""
    from streamrl.weightsync.feed import WeightFeed

    cfg = _cfg(url, "C")
    template = {name: torch.zeros_like(t) for name, t in _weights(params).items()}
    feed = WeightFeed.from_config(cfg.weightsync, cfg.broker, cfg.run, actor_id)
    sub = feed.subscriber(template).start()
    _emit(event="ready")
    while True:
        staged = sub.take_staged()
        if staged is None:
            time.sleep(0.002)
            continue
        version, tensors = staged
        for name, tensor in tensors.items():
            template[name].copy_(tensor)
        sub.applied(version)
        _emit(event="applied", version=version)


def relay_main(argv: list[str]) -> int:
    """Host C: ``python -m streamrl.weightsync.relay`` itself, each served version's phase marks
    (``DistReceiver.marks``) on stdout."""
    from streamrl.weightsync import relay

    release = relay.Relay._release

    def _release(self, version: int, ok: bool) -> None:
        release(self, version, ok)
        if ok:
            _emit(event="served", version=version, marks=self.receiver.marks)

    relay.Relay._release = _release
    return relay.main(argv)


def gloo_main(rank: int, address: str, port: int, params: int) -> None:
    """A bare broadcast of ``params`` fp32 in ``BUCKET`` pieces from rank 0 (A) to rank 1 (C), once
    per ``round`` line on rank 0's stdin (its time on stdout), until ``quit``."""
    import torch.distributed as tdist

    from streamrl.broker.netaddr import toward
    from streamrl.weightsync.transports.dist.group import make_group

    timeout = dt.timedelta(seconds=120)
    store = tdist.TCPStore(address, port, 2, is_master=rank == 0, timeout=timeout)
    local = address if rank == 0 else toward(address)
    group = make_group("gloo", store, rank, 2, 120, local)
    total = params * 4
    bucket = torch.zeros(min(BUCKET, total), dtype=torch.uint8)
    go, done = torch.zeros(1, dtype=torch.uint8), torch.zeros(1, dtype=torch.uint8)
    # the receiver says it holds the last byte
    back = tdist.BroadcastOptions()
    back.rootRank = 1
    while True:
        if rank == 0:
            go[0] = (sys.stdin.readline().split() or ["quit"])[0] == "round"
        # rank 1 waits here, ready, until rank 0 says go (or stop)
        group.broadcast([go], tdist.BroadcastOptions()).wait(timeout)
        if not go[0]:
            return
        start = time.perf_counter()
        for offset in range(0, total, BUCKET):
            chunk = bucket[: min(BUCKET, total - offset)]
            group.broadcast([chunk], tdist.BroadcastOptions()).wait(timeout)
        group.broadcast([done], back).wait(timeout)
        if rank == 0:
            _emit(event="gloo", seconds=time.perf_counter() - start)


class _Child:
    def __init__(self, host, argv: list[str]):
        self.p = host.popen(
            argv, cwd=TESTS.parent, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def send(self, line: str) -> None:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def next(self, kind: str) -> dict:
        for line in self.p.stdout:
            if line.startswith("{"):
                event = json.loads(line)
                if event["event"] == kind:
                    return event
        raise RuntimeError(f"{self.p.args[-1]!r} ended without a {kind!r} event")


def _me(*args) -> list[str]:
    return [sys.executable, "-m", "bench.weightsync_hosts", *map(str, args)]


def _gloo_pair(hosts, params: int) -> tuple[_Child, _Child]:
    from streamrl.broker.server import free_port

    port = free_port()
    root = _Child(hosts["A"], _me("gloo", 0, hosts["A"].address, port, params))
    return root, _Child(hosts["C"], _me("gloo", 1, hosts["A"].address, port, params))


def _relay_case(hosts, params: int, actors: int) -> dict:
    """Each version published through the relay, each after one bare gloo round (the same bytes,
    A to C): the load of a shared machine weighs on both alike."""
    a, c = hosts["A"], hosts["C"]
    learner = _Child(a, _me("learner", a.address, params))
    url = learner.next("redis")["url"]
    relay = _Child(
        c,
        _me(
            "relay", "--host-id", "C",
            "run.name=bench-hosts", f"run.dir={tempfile.gettempdir()}", f"broker.redis_url={url}",
            "weightsync.transport=dist", "weightsync.dist.relay=true",
            "weightsync.dist.backend=gloo", f"weightsync.dist.bucket_bytes={BUCKET}", "weightsync.timeout_s=60", "metrics.enabled=false",
        ),
    )  # fmt: skip
    subs = [_Child(c, _me("actor", url, f"c{i}", params)) for i in range(actors)]
    gloo = _gloo_pair(hosts, params)
    try:
        for sub in subs:
            sub.next("ready")
        learner.send("members 1")
        learner.next("members")
        gloo_s, relay_s, splits, received = [], [], [], 0
        # version 0 pays first-touch costs and the group's forming; it is not counted
        for version in range(ROUNDS + 1):
            gloo[0].send("round")
            gloo_round = gloo[0].next("gloo")["seconds"]
            before = c.rx_bytes()
            learner.send(f"publish {version}")
            published = learner.next("published")
            served = relay.next("served")
            for sub in subs:
                while sub.next("applied")["version"] < version:
                    pass
            if version > 0:
                received += c.rx_bytes() - before
                gloo_s.append(gloo_round)
                relay_s.append(published["relay_s"])
                splits.append(_split(published["marks"], served["marks"]))
        gloo[0].send("quit")
        # the relay leaves before the learner's store goes: it never waits on a store that is gone
        relay.p.terminate()
        relay.p.wait(timeout=30)
        learner.send("quit")
        learner.p.wait(timeout=30)
        return {
            "gloo": min(gloo_s),
            "gloo_median": statistics.median(gloo_s),
            "relay": min(relay_s),
            "split": {k: statistics.median(s[k] for s in splits) for k in splits[0]},
            "link": received / ROUNDS / published["bytes"],
            "bytes": published["bytes"],
            "host": published["host"],
        }
    finally:
        for child in (*gloo, *subs, relay, learner):
            if child.p.poll() is None:
                child.p.kill()
            child.p.wait(timeout=30)


# the phases of one hand-over as (column, host, mark): each mark's time after the publish started
MILESTONES = (
    ("A header set", "A", "header"),
    ("C header read", "C", "header"),
    ("A slot written", "A", "slot"),
    ("A last bucket sent", "A", "sent"),
    ("C last bucket in", "C", "received"),
    ("C slot stamped", "C", "committed"),
    ("C announced", "C", "announced"),
)


def _split(on_a: dict, on_c: dict) -> dict[str, float]:
    """Each milestone of one version in ms after its publish started (one machine, one clock)."""
    marks = {"A": on_a, "C": on_c}
    return {col: (marks[h][m] - on_a["publish"]) * 1e3 for col, h, m in MILESTONES}


def run(params: int = 25_000_000) -> str:
    sys.path.insert(0, str(TESTS))
    import netns_hosts

    from bench.__main__ import machine

    lines = [
        "## weightsync across hosts (relay)",
        "",
        f"{time.strftime('%Y-%m-%d')} · {machine()} · load average {os.getloadavg()[0]:.1f} · "
        f"command: `python -m bench.weightsync_hosts --params {params}`",
        "",
    ]
    why = netns_hosts.available()
    if why is not None:
        return "\n".join([*lines, f"skipped: {why}", ""])
    lines += [
        f"Hosts A and C are network namespaces on one bridge (veth, MTU 1500); fp32, {params / 1e6:.0f}M "
        f"parameters in tensors of 4M, 64 MiB buckets, gloo; best of {ROUNDS} versions after one "
        "that pays first-touch costs and the group's forming (each version applied by every actor "
        "on C before the next). Goals: relay / gloo <= 1.5; link bytes per version <= 1.05 models "
        "with 1 and with 4 actors on C.",
        "",
        "| actors on C | MB | learner's dist.host | gloo ms | relay ms | relay / gloo "
        "| link bytes per version / model |",
        "|---|---|---|---|---|---|---|",
    ]
    with (
        tempfile.TemporaryDirectory(prefix="bench-hosts-") as root,
        netns_hosts.hosts(Path(root), ("A", "C")) as hosts,
    ):
        splits = []
        for actors in (1, 4):
            r = _relay_case(hosts, params, actors)
            gloo = r["gloo"]
            lines.append(
                f"| {actors} | {r['bytes'] / 1e6:.0f} | {r['host']} | {gloo * 1e3:.0f} "
                f"| {r['relay'] * 1e3:.0f} | {r['relay'] / gloo:.2f} | {r['link']:.3f} |"
            )
            splits.append((actors, r["gloo_median"], r["split"]))
    lines += [
        "",
        "Where the time goes: each phase's end in ms after the publish started on A, the median "
        f"of the {ROUNDS} versions (A's marks: `HostSender.marks`, C's: the relay's "
        "`DistReceiver.marks`; one machine, one clock), beside the median of that row's gloo rounds.",
        "",
        "| actors on C | gloo ms (median) | " + " | ".join(c for c, _, _ in MILESTONES) + " |",
        "|---|---|" + "---|" * len(MILESTONES),
        *(
            f"| {actors} | {gloo * 1e3:.1f} | "
            + " | ".join(f"{split[col]:.1f}" for col, _, _ in MILESTONES)
            + " |"
            for actors, gloo, split in splits
        ),
        "",
        "gloo and relay are interleaved per row (a gloo round before each version). *relay ms* adds "
        "to the broadcast the signed header (after the member check in Redis), the first piece of "
        "the learner's one copy (into its own host's shm slot, written in 4 MiB pieces, each "
        "broadcast from there while the next is written and summed), the signed checksums that "
        "follow the last piece (the relay stamps its slot with them: its actors check the bytes "
        "end to end) and the relay's announcement. On a shared, loaded machine single rows swing "
        "both ways: compare the best of several runs. The link counter counts what host C received, headers and Redis traffic "
        "included: a copy per actor would read about the number of actors. Not measured here: "
        "NCCL between hosts (no GPUs on this machine).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=25_000_000)
    parser.add_argument("--out", type=Path, default=None, help="write the section to this file too")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    text = run(args.params)
    print(text, flush=True)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    role, rest = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if role == "learner":
        learner_main(rest[0], int(rest[1]))
    elif role == "actor":
        actor_main(rest[0], rest[1], int(rest[2]))
    elif role == "relay":
        sys.exit(relay_main(rest))
    elif role == "gloo":
        gloo_main(int(rest[0]), rest[1], int(rest[2]), int(rest[3]))
    else:
        sys.exit(main())
