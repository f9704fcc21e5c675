"""Weight publishing: shm publish -> applied in a subscriber process vs a plain memcpy of the same bytes,
dist (gloo) broadcast time per GB, and peak RSS of publisher and subscriber.

    python -m bench --only weightsync            (part of `make bench`)

The publisher and the subscriber are separate processes (``python -m
bench.weightsync pub|sub``) talking through a real embedded Redis; the
orchestrator asks for one publish at a time and waits until the subscriber has
applied it, so every number is one complete hand-over.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import torch

# params per tensor: a few MB per tensor, like an LLM's projection matrices
CHUNK = 4 << 20
ROUNDS = 5


def _shapes(params: int) -> list[int]:
    return [min(CHUNK, params - start) for start in range(0, params, CHUNK)]


def _cfg(url: str, run: str, transport: str, slots: int):
    from streamrl.configs.schema import Config

    return Config.model_validate(
        {
            "run": {"name": run, "dir": tempfile.gettempdir()},
            "broker": {"redis_url": url},
            "weightsync": {
                "transport": transport,
                "slots": slots,
                "timeout_s": 120,
                "backend": "gloo",
                "bucket_bytes": 64 << 20,
            },
        }
    )


def _memory_mib() -> dict:
    """Peak RSS (VmHWM: unlike ru_maxrss it restarts at exec) and private RSS now (RssAnon: no shm)."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon"):
                fields[key] = int(value.split()[0]) / 1024
    return {"peak": fields["VmHWM"], "private": fields["RssAnon"]}


def _memcpy_seconds(weights: dict[str, torch.Tensor], flat: torch.Tensor) -> float:
    """The baseline: the same tensors copied into pre-faulted private memory, best of 3."""
    best = float("inf")
    for _ in range(3):
        start, offset = time.perf_counter(), 0
        for t in weights.values():
            flat[offset : offset + t.numel()].copy_(t)
            offset += t.numel()
        best = min(best, time.perf_counter() - start)
    return best


def _emit(**event) -> None:
    print(json.dumps(event), flush=True)


def publisher_main(url: str, run: str, transport: str, slots: int, params: int) -> None:
    from streamrl.weightsync.publisher import Publisher

    pub = Publisher.from_config(_cfg(url, run, transport, slots))
    weights = {
        f"module.layer{i}": torch.full((n,), float(i)) for i, n in enumerate(_shapes(params))
    }
    flat = torch.zeros(params)
    _emit(event="ready")
    for line in sys.stdin:
        command = line.split()
        if command[0] == "publish":
            memcpy = _memcpy_seconds(weights, flat)
            started = time.time()
            stats = pub.publish(int(command[1]), weights)
            _emit(
                event="published",
                version=stats.version,
                started=started,
                seconds=stats.seconds,
                bytes=stats.bytes,
                memcpy=memcpy,
            )
        elif command[0] == "quit":
            break
    memory = _memory_mib()
    pub.close()
    _emit(event="rss", **memory)


def subscriber_main(url: str, run: str, transport: str, slots: int, params: int) -> None:
    from streamrl.weightsync.subscriber import Subscriber, swap_into_model

    model = torch.nn.Module()
    for i, n in enumerate(_shapes(params)):
        model.register_parameter(
            f"layer{i}", torch.nn.Parameter(torch.zeros(n), requires_grad=False)
        )
    sub = Subscriber.from_config(
        _cfg(url, run, transport, slots), "bench", dict(model.named_parameters())
    ).start()
    _emit(event="ready")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        staged = sub.take_staged()
        if staged is None:
            time.sleep(0.0005)
            continue
        version, tensors = staged
        apply_s, replaced = swap_into_model(model, tensors)
        sub.applied(version, recycled=replaced)
        _emit(
            event="applied",
            version=version,
            at=time.time(),
            receive=sub.last_receive_seconds,
            apply=apply_s,
        )
        if version >= ROUNDS:
            break
    memory = _memory_mib()
    sub.close()
    _emit(event="rss", **memory)


class _Child:
    def __init__(self, role: str, *args):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.p = subprocess.Popen(
            [sys.executable, "-m", "bench.weightsync", role, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def next(self, kind: str) -> dict:
        for line in self.p.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event["event"] == kind:
                return event
        raise RuntimeError(f"child exited before {kind}")

    def send(self, line: str) -> None:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()


def _one_size(url: str, transport: str, params: int, slots: int = 3) -> dict:
    run = f"bench-{transport}-{params}"
    pub = _Child("pub", url, run, transport, slots, params)
    sub = _Child("sub", url, run, transport, slots, params)
    try:
        pub.next("ready")
        sub.next("ready")
        if transport == "dist":
            # the subscriber's first heartbeat registers it as a member
            time.sleep(1.0)
        rows = []
        # version 0 pays first-touch costs once; it is not reported
        for version in range(ROUNDS + 1):
            pub.send(f"publish {version}")
            published = pub.next("published")
            applied = sub.next("applied")
            if version > 0:
                rows.append({**published, **applied, "e2e": applied["at"] - published["started"]})
        pub.send("quit")
        best = min(rows, key=lambda r: r["e2e"])
        best["memcpy"] = min(r["memcpy"] for r in rows)
        return {**best, "pub_mem": pub.next("rss"), "sub_mem": sub.next("rss")}
    finally:
        for child in (pub, sub):
            if child.p.poll() is None:
                child.p.kill()
            child.p.wait(timeout=30)


def run(quick: bool = False) -> str:
    from bench.__main__ import machine
    from streamrl.broker.server import EmbeddedRedis
    from streamrl.configs.schema import Config

    torch.set_num_threads(1)
    sizes = [10_000_000] if quick else [10_000_000, 100_000_000, 500_000_000]
    command = f"python -m bench --only weightsync{' --quick' if quick else ''}"
    lines = [
        "## weightsync",
        "",
        f"{time.strftime('%Y-%m-%d')} · {machine()} · command: `make bench` (`{command}`)",
        "",
        "Publisher and subscriber are separate processes; fp32 weights in tensors of 4M "
        f"parameters; best of {ROUNDS} hand-overs after a first one that pays page faults. "
        "*memcpy* = the publisher process copying the same tensors into pre-faulted private "
        "memory (best of 3, measured right before each publish). *e2e* = publish call start -> "
        "the subscriber's engine loop has applied the version: publisher copy into shm, "
        "subscriber copy into its staging buffer (in the background, generation goes on), "
        "`swap_into_model` into the live parameters (pointer swaps: the only part that pauses the engine). "
        "Goal: e2e <= 2x memcpy.",
        "",
        "| transport | slots | params | MB | memcpy ms | publish ms | receive ms | apply ms "
        "| e2e ms | e2e / memcpy | peak RSS pub / sub MiB | private pub / sub MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    with EmbeddedRedis(Config().broker, tempfile.mkdtemp(prefix="bench-ws-")) as server:
        # 500M: 2 slots keep shm at 4 GB next to 2 GB each of weights, staging and model
        cases = [("shm", n, 2 if n >= 500_000_000 else 3) for n in sizes]
        cases.append(("dist", 10_000_000 if quick else 100_000_000, 3))
        dist_line = "dist: skipped (see the table)."
        for transport, params, slots in cases:
            try:
                r = _one_size(server.url, transport, params, slots)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                lines.append(f"| {transport} | {slots} | {params / 1e6:.0f}M | skipped: {exc} |")
                continue
            pm, sm = r["pub_mem"], r["sub_mem"]
            lines.append(
                f"| {transport} | {slots} | {params / 1e6:.0f}M | {r['bytes'] / 1e6:.0f} "
                f"| {r['memcpy'] * 1e3:.1f} | {r['seconds'] * 1e3:.1f} | {r['receive'] * 1e3:.1f} "
                f"| {r['apply'] * 1e3:.1f} | {r['e2e'] * 1e3:.1f} | {r['e2e'] / r['memcpy']:.2f} "
                f"| {pm['peak']:.0f} / {sm['peak']:.0f} | {pm['private']:.0f} / {sm['private']:.0f} |"
            )
            if transport == "dist":
                per_gb = r["seconds"] / (r["bytes"] / 1e9)
                dist_line = f"dist on gloo (loopback, 1 subscriber, 64 MiB buckets): {per_gb:.2f} s per GB published."
    lines += ["", dist_line]
    lines += [
        "",
        "Peak RSS counts the shared-memory pages a process maps (every slot, pre-faulted); "
        "private RSS (RssAnon at the end) leaves them out. The publisher's private memory holds "
        "the weights and the memcpy baseline's buffer of the same size; the subscriber's, the "
        "live parameters and the one staging copy.",
        "",
        "Reading it: e2e is three sequential copies, so it lands near 3x memcpy; 2x is not "
        "reachable without dropping a copy. What stalls anything is smaller: the learner waits "
        "for *publish* (one copy), the engine pauses only for *apply* (pointer swaps); *receive* "
        "overlaps generation. The machine is shared (2 cores), so rows vary run to run.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    torch.set_num_threads(1)
    role, url, run_name, transport, slots, params = sys.argv[1:7]
    main = publisher_main if role == "pub" else subscriber_main
    main(url, run_name, transport, int(slots), int(params))
