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
import resource
import subprocess
import sys
import tempfile
import time

import torch

CHUNK = 4 << 20  # params per tensor: a few MB per tensor, like an LLM's projection matrices
ROUNDS = 3


def _shapes(params: int) -> list[int]:
    return [min(CHUNK, params - start) for start in range(0, params, CHUNK)]


def _cfg(url: str, run: str, transport: str, slots: int):
    from configs.schema import Config

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


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _emit(**event) -> None:
    print(json.dumps(event), flush=True)


def publisher_main(url: str, run: str, transport: str, slots: int, params: int) -> None:
    from weightsync import make_publisher

    pub = make_publisher(_cfg(url, run, transport, slots))
    weights = {
        f"module.layer{i}": torch.full((n,), float(i)) for i, n in enumerate(_shapes(params))
    }
    _emit(event="ready")
    for line in sys.stdin:
        command = line.split()
        if command[0] == "publish":
            started = time.time()
            stats = pub.publish(int(command[1]), weights)
            _emit(
                event="published",
                version=stats.version,
                started=started,
                seconds=stats.seconds,
                bytes=stats.bytes,
            )
        elif command[0] == "quit":
            break
    pub.close()
    _emit(event="rss", mib=_peak_rss_mib())


def subscriber_main(url: str, run: str, transport: str, slots: int, params: int) -> None:
    from weightsync import make_subscriber
    from weightsync.subscriber import apply_to_model

    model = torch.nn.Module()
    for i, n in enumerate(_shapes(params)):
        model.register_parameter(
            f"layer{i}", torch.nn.Parameter(torch.zeros(n), requires_grad=False)
        )
    sub = make_subscriber(
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
        apply_s = apply_to_model(model, tensors)
        sub.applied(version)
        _emit(
            event="applied",
            version=version,
            at=time.time(),
            receive=sub.last_receive_seconds,
            apply=apply_s,
        )
        if version >= ROUNDS:
            break
    sub.close()
    _emit(event="rss", mib=_peak_rss_mib())


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


def _memcpy_seconds(nbytes: int) -> float:
    src = torch.ones(nbytes // 4)
    dst = torch.zeros(nbytes // 4)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return best


def _one_size(url: str, transport: str, params: int, slots: int = 3) -> dict:
    run = f"bench-{transport}-{params}"
    pub = _Child("pub", url, run, transport, slots, params)
    sub = _Child("sub", url, run, transport, slots, params)
    try:
        pub.next("ready")
        sub.next("ready")
        if transport == "dist":
            time.sleep(1.0)  # the subscriber's first heartbeat registers it as a member
        rows = []
        for version in range(
            ROUNDS + 1
        ):  # version 0 pays first-touch costs once; it is not reported
            pub.send(f"publish {version}")
            published = pub.next("published")
            applied = sub.next("applied")
            if version > 0:
                rows.append({**published, **applied, "e2e": applied["at"] - published["started"]})
        pub.send("quit")
        best = min(rows, key=lambda r: r["e2e"])
        return {**best, "pub_rss": pub.next("rss")["mib"], "sub_rss": sub.next("rss")["mib"]}
    finally:
        for child in (pub, sub):
            if child.p.poll() is None:
                child.p.kill()
            child.p.wait(timeout=30)


def run(quick: bool = False) -> str:
    from bench.__main__ import machine
    from broker.server import EmbeddedRedis
    from configs.schema import Config

    torch.set_num_threads(1)
    sizes = [10_000_000] if quick else [10_000_000, 100_000_000, 500_000_000]
    lines = [
        "## weightsync",
        "",
        f"{time.strftime('%Y-%m-%d')} · {machine()} · command: `make bench` (`python -m bench --only weightsync{' --quick' if quick else ''}`)",
        "",
        "Publisher and subscriber are separate processes; fp32 weights in tensors of 4M parameters; best of "
        f"{ROUNDS} hand-overs after a first one that pays page faults. *e2e* = publish call start -> the "
        "subscriber's engine loop has applied the version (publisher copy into shm + subscriber copy into its "
        "staging buffer + `apply_to_model` copy into the live parameters: three copies of the bytes). "
        "Goal: e2e <= 2x one memcpy of the same bytes.",
        "",
        "| transport | slots | params | MB | memcpy ms | publish ms | receive ms | apply ms | e2e ms | e2e / memcpy | peak RSS pub / sub MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    with EmbeddedRedis(Config().broker, tempfile.mkdtemp(prefix="bench-ws-")) as server:
        # 500M: 2 slots keep shm at 4 GB next to 2 GB of weights, staging and model each (24 GiB machine)
        cases = [("shm", n, 2 if n >= 500_000_000 else 3) for n in sizes] + [
            ("dist", 10_000_000 if quick else 100_000_000, 3)
        ]
        for transport, params, slots in cases:
            try:
                r = _one_size(server.url, transport, params, slots)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                lines.append(
                    f"| {transport} | {slots} | {params / 1e6:.0f}M | - | - | - | - | - | - | - | skipped: {exc} |"
                )
                continue
            memcpy = _memcpy_seconds(r["bytes"])
            lines.append(
                f"| {transport} | {slots} | {params / 1e6:.0f}M | {r['bytes'] / 1e6:.0f} | {memcpy * 1e3:.1f} | {r['seconds'] * 1e3:.1f} | "
                f"{r['receive'] * 1e3:.1f} | {r['apply'] * 1e3:.1f} | {r['e2e'] * 1e3:.1f} | {r['e2e'] / memcpy:.2f} | "
                f"{r['pub_rss']:.0f} / {r['sub_rss']:.0f} |"
            )
            if transport == "dist":
                lines.append("")
                lines.append(
                    f"dist on gloo (loopback, 1 subscriber): {r['seconds'] / (r['bytes'] / 1e9):.2f} s per GB published."
                )
    lines += [
        "",
        "Peak RSS counts the shared-memory pages a process has touched (the publisher maps all slots).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    torch.set_num_threads(1)
    role, url, run_name, transport, slots, params = sys.argv[1:7]
    main = publisher_main if role == "pub" else subscriber_main
    main(url, run_name, transport, int(slots), int(params))
