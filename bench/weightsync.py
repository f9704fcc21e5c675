"""Weight publishing: shm publish -> applied in a subscriber process vs a plain copy of the same bytes,
dist (gloo) broadcast time per GB, peak RSS of publisher and subscriber, and across hosts (the
host relay against a raw gloo broadcast, bytes per version on an actor host's link:
``bench.weightsync_hosts``).

    python -m bench --only weightsync            (part of `make bench`: synthetic fp32 tensors)
    python -m bench.weightsync --shape qwen05b --device cuda [--actor-device cuda]
    python -m bench.weightsync --shape qwen05b --device cuda --actor-device cuda --transport cuda_ipc

The publisher and the subscriber are separate processes (``python -m
bench.weightsync pub|sub``) talking through a real embedded Redis; the
orchestrator asks for one publish at a time and waits until the subscriber has
applied it, so every number is one complete hand-over.

``--shape`` publishes a real model's parameters instead: ``qwen05b`` is
Qwen2.5-0.5B's architecture built from its config with random weights (no hub),
``tiny`` a 4-layer one for a smoke run. The learner side holds it on
``--device`` (bfloat16 on a GPU, as the learner trains it), the actor side on
``--actor-device``, each converting as a real run does. The reference is the
plain copy of the published bytes on the publisher's side: into pre-faulted
memory on CPU, device -> pinned host memory on a GPU (the bytes converted to
the transfer dtype on the device first, as the publisher does). ``--transport
cuda_ipc`` (learner and actor on the GPU) measures against a device-to-device copy
of the same bytes instead, and reports ms per billion parameters; without CUDA its
row says it was skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

# params per tensor: a few MB per tensor, like an LLM's projection matrices
CHUNK = 4 << 20
ROUNDS = 5
OUT = Path("docs/bench/weightsync.md")
# Qwen2.5-0.5B's architecture (its config.json), and a small one of the same family
SHAPES = {
    "qwen05b": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    ),
    "tiny": dict(
        hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=4096, max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
}  # fmt: skip


def build_model(shape: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """A Qwen2 causal LM of ``shape`` with random weights, built on ``device`` (no download)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[shape])
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def _model_dtype(device: str) -> torch.dtype:
    from streamrl.policy.load import resolve_dtype

    return resolve_dtype("auto", device)


def _shapes(params: int) -> list[int]:
    return [min(CHUNK, params - start) for start in range(0, params, CHUNK)]


def _options(transport: str, slots: int) -> dict:
    """The transport's own section: a ring of ``slots``, or dist's gloo group."""
    if transport == "dist":
        return {"dist": {"backend": "gloo", "bucket_bytes": 64 << 20}}
    return {transport: {"slots": slots}} if transport in ("shm", "cuda_ipc") else {}


def _cfg(url: str, run: str, transport: str, slots: int, actor_device: str = "cpu"):
    from streamrl.configs.schema import Config

    return Config.model_validate(
        {
            "run": {"name": run, "dir": tempfile.gettempdir()},
            "broker": {"redis_url": url},
            "actor": {"device": actor_device},
            "weightsync": {"transport": transport, "timeout_s": 120, **_options(transport, slots)},
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
    """The baseline: the same tensors copied into pre-faulted private memory (on a GPU: converted
    to ``flat``'s dtype on the device, then copied into pinned ``flat``, or into ``flat`` on the
    device: a device-to-device copy), best of 3."""
    best = float("inf")
    cuda = flat.is_pinned() or flat.is_cuda
    for _ in range(3):
        if cuda:
            torch.cuda.synchronize()
        start, offset = time.perf_counter(), 0
        for t in weights.values():
            if t.is_floating_point():
                src = t.to(flat.dtype) if cuda else t
                flat[offset : offset + t.numel()].copy_(src.reshape(-1), non_blocking=cuda)
            offset += t.numel()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def _flat_copy_seconds(flat: torch.Tensor, source: torch.Tensor) -> float:
    """cuda_ipc's baseline: one device-to-device copy of the same bytes, flat to flat, best of 3
    (per tensor, ~290 launches at Qwen2.5-0.5B, the copy is launch-bound and flatters the bar)."""
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        flat.copy_(source)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def _emit(**event) -> None:
    print(json.dumps(event), flush=True)


def _learner_weights(params: int, shape: str, device: str) -> dict[str, torch.Tensor]:
    if shape == "synthetic":
        return {
            f"module.layer{i}": torch.full((n,), float(i)) for i, n in enumerate(_shapes(params))
        }
    model = build_model(shape, device, _model_dtype(device))
    return {n: p.detach() for n, p in model.named_parameters()}


def publisher_main(
    url: str, run: str, transport: str, slots: int, params: int, shape: str, device: str,
    actor_device: str,
) -> None:  # fmt: skip
    from streamrl.weightsync.publisher import Publisher, transfer_dtype

    cfg = _cfg(url, run, transport, slots, actor_device)
    dtype = transfer_dtype(cfg.weightsync, cfg.model, cfg.actor)
    pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run, dtype)
    weights = _learner_weights(params, shape, device)
    numel = sum(t.numel() for t in weights.values() if t.is_floating_point())
    if pub.transport.device_ipc:
        flat = torch.zeros(numel, dtype=pub.dtype, device=device)
        source = torch.ones_like(flat)
    else:
        flat = torch.zeros(numel, dtype=pub.dtype, pin_memory=device == "cuda")
    _emit(event="ready")
    for line in sys.stdin:
        command = line.split()
        if command[0] == "publish":
            if pub.transport.device_ipc:
                memcpy = _flat_copy_seconds(flat, source)
            else:
                memcpy = _memcpy_seconds(weights, flat)
            if device == "cuda":
                torch.cuda.synchronize()
            started = time.time()
            stage = pub.submit(int(command[1]), weights)
            pub.flush()
            _emit(
                event="published",
                version=int(command[1]),
                started=started,
                seconds=time.time() - started,
                stage=stage,
                bytes=pub._layout.total_bytes if pub.transport.publishes else 0,
                params=numel,
                memcpy=memcpy,
            )
        elif command[0] == "quit":
            break
    memory = _memory_mib()
    pub.close()
    _emit(event="rss", **memory)


def _actor_model(params: int, shape: str, device: str) -> torch.nn.Module:
    if shape != "synthetic":
        return build_model(shape, device, _model_dtype(device))
    model = torch.nn.Module()
    for i, n in enumerate(_shapes(params)):
        model.register_parameter(
            f"layer{i}", torch.nn.Parameter(torch.zeros(n), requires_grad=False)
        )
    return model


def subscriber_main(
    url: str, run: str, transport: str, slots: int, params: int, shape: str, device: str,
    actor_device: str,
) -> None:  # fmt: skip
    from streamrl.weightsync.subscriber import Subscriber, swap_into_model

    model = _actor_model(params, shape, actor_device)
    for p in model.parameters():
        p.requires_grad_(False)
    cfg = _cfg(url, run, transport, slots, actor_device)
    template = dict(model.named_parameters())
    sub = Subscriber.from_config(cfg.weightsync, cfg.broker, cfg.run, "bench", template).start()
    _emit(event="ready")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        staged = sub.take_staged()
        if staged is None:
            time.sleep(0.0005)
            continue
        version, tensors = staged
        # as the hf engine applies a version: in place on a GPU (its CUDA graphs hold the
        # parameters by address, actor.hf.cuda_graphs auto), by pointer swaps on a CPU
        apply_s, replaced = swap_into_model(model, tensors, in_place=actor_device == "cuda")
        if actor_device == "cuda":
            torch.cuda.synchronize()
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


def _one_size(
    url: str, transport: str, params: int, slots: int = 3, shape: str = "synthetic",
    device: str = "cpu", actor_device: str = "cpu",
) -> dict:  # fmt: skip
    run = f"bench-{transport}-{params}-{shape}-{device}-{actor_device}"
    args = (url, run, transport, slots, params, shape, device, actor_device)
    pub = _Child("pub", *args)
    sub = _Child("sub", *args)
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
    if os.environ.get("BENCH_WEIGHTSYNC_MAX_PARAMS"):
        # a machine short of memory (the 500M case maps ~16 GB in all)
        cap = int(os.environ["BENCH_WEIGHTSYNC_MAX_PARAMS"])
        sizes = [n for n in sizes if n <= cap]
        command = f"BENCH_WEIGHTSYNC_MAX_PARAMS={cap} {command}"
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
        "| transport | slots | params | MB | memcpy ms | learner ms | publish ms | receive ms "
        "| apply ms | e2e ms | e2e / memcpy | peak RSS pub / sub MiB | private pub / sub MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
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
                f"| {r['memcpy'] * 1e3:.1f} | {r['stage'] * 1e3:.1f} | {r['seconds'] * 1e3:.1f} "
                f"| {r['receive'] * 1e3:.1f} "
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
        "Reading it: *learner* is what the learner waits for (`Publisher.submit`): one copy "
        "into a pre-allocated staging buffer, about 1x memcpy. The rest runs on the publisher's "
        "thread while the learner trains: the shm write (a second copy, its checksum summed block "
        "by block as it lands), the announcement, then the subscriber's copy into its staging set "
        "(checked the same way; in the background, generation goes on) and the swap (*apply*, "
        "pointer swaps: the only part that pauses the engine). e2e is therefore three copies, "
        "3-4x memcpy. Copying the learner's weights straight into the slot would drop one copy "
        "on CPU; on a GPU, a device-to-host copy straight into a slot registered as pinned "
        "memory (and the reader's host-to-device copy from a registered mapping) is what an e2e "
        "of 2x a pinned copy needs. The machine is shared (2 cores), so rows vary run to run.",
    ]
    from bench import weightsync_hosts

    hosts = weightsync_hosts.run(5_000_000 if quick else 25_000_000)
    return "\n".join(lines) + "\n\n" + hosts


def model_run(
    shape: str, device: str, actor_devices: list[str], transport: str = "shm", echo=None
) -> str:
    """publish -> applied for ``shape``'s parameters, learner on ``device``, one row per actor
    device, over ``transport``. ``echo`` gets the heading, then each row as it is measured (a
    later row's timeout keeps it)."""
    echo = echo or (lambda text: None)
    from bench.__main__ import machine
    from streamrl.broker.server import EmbeddedRedis
    from streamrl.configs.schema import Config
    from streamrl.weightsync import transports

    device_ipc = transports.get(transport).device_ipc
    gpu = torch.cuda.get_device_name() if device == "cuda" else "no GPU"
    if device_ipc:
        reference = "one flat device -> device copy"
    elif device == "cuda":
        reference = "device -> pinned host copy"
    else:
        reference = "copy into pre-faulted memory"
    command = (
        f"python -m bench.weightsync --shape {shape} --device {device} "
        f"--actor-device {','.join(actor_devices)} --transport {transport}"
    )
    lines = [
        f"## weightsync at a model's shape: {shape}, learner on {device}, {transport}",
        "",
        f"{time.strftime('%Y-%m-%d')} · {machine()} · {gpu} · load average "
        f"{os.getloadavg()[0]:.1f} · command: `{command}`",
        "",
        f"Random-init weights of {shape}'s architecture, held by the publisher on {device} in "
        f"{_model_dtype(device)}; best of {ROUNDS} hand-overs after one that pays first-touch costs. "
        f"*reference* = {reference} of the same bytes, measured right before each publish. "
        "*learner* = what the learner waits for (`Publisher.submit`: the staging copy); "
        "*e2e* = submit -> the subscriber process has swapped the version into its model. "
        + (
            "Goal (cuda_ipc): e2e <= 2x a device -> device copy and <= 25 ms per billion parameters."
            if device_ipc
            else "Goal (GPU): e2e <= 2x a device -> pinned copy."
        ),
        "",
        "| actor device | transfer dtype | MB | reference ms | learner ms | receive ms | apply ms "
        "| e2e ms | learner / reference | e2e / reference | e2e ms per 1B params |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    echo("\n".join(lines))
    with EmbeddedRedis(Config().broker, tempfile.mkdtemp(prefix="bench-ws-")) as server:
        for actor_device in actor_devices:
            if device_ipc and not (device == actor_device == "cuda" and torch.cuda.is_available()):
                lines.append(
                    f"| {actor_device} | skipped: {transport} needs CUDA and --device cuda "
                    "--actor-device cuda |"
                )
                echo(lines[-1])
                continue
            r = _one_size(server.url, transport, 0, 3, shape, device, actor_device)
            from streamrl.weightsync.publisher import transfer_dtype

            cfg = _cfg(server.url, "x", transport, 3, actor_device)
            dtype = str(transfer_dtype(cfg.weightsync, cfg.model, cfg.actor)).removeprefix("torch.")
            lines.append(
                f"| {actor_device} | {dtype} | {r['bytes'] / 1e6:.0f} | {r['memcpy'] * 1e3:.1f} "
                f"| {r['stage'] * 1e3:.1f} | {r['receive'] * 1e3:.1f} | {r['apply'] * 1e3:.1f} "
                f"| {r['e2e'] * 1e3:.1f} | {r['stage'] / r['memcpy']:.2f} | {r['e2e'] / r['memcpy']:.2f} "
                f"| {r['e2e'] * 1e3 / (r['params'] / 1e9):.1f} |"
            )
            echo(lines[-1])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="publish -> applied at a model's shape")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen05b")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--actor-device", default=None, help="comma-separated (default: cpu, plus cuda on a GPU)"
    )
    parser.add_argument("--transport", choices=["shm", "cuda_ipc"], default="shm")
    parser.add_argument("--out", type=Path, default=None, help="write the table to this file too")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    actors = (args.actor_device or ("cpu,cuda" if args.device == "cuda" else "cpu")).split(",")
    torch.set_num_threads(1)
    text = model_run(
        args.shape, args.device, actors, args.transport, lambda t: print(t, flush=True)
    )
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    if len(sys.argv) > 1 and sys.argv[1] in ("pub", "sub"):
        role, url, run_name, transport, slots, params, shape, device, actor_device = sys.argv[1:10]
        child = publisher_main if role == "pub" else subscriber_main
        child(url, run_name, transport, int(slots), int(params), shape, device, actor_device)
    else:
        sys.exit(main())
