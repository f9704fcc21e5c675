"""What the shm transport's per-tensor checksums cost: write and read with them vs the bare copies.

    python -m bench --only shm_checksum          (part of `make bench`)
    python -m bench.shm_checksum [--quick]       (this section alone, printed)

One process, one segment: ``ShmWriter.write`` (copy + checksum of each tensor
in the slot) against a plain copy of the same tensors into the same slot pages,
and ``ShmReader.read_into`` (copy + checksum of the copy) against a plain copy
of the slot into the same destination tensors. Each pair runs back to back,
best of ROUNDS, after a first round that pays page faults.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

import numpy as np
import torch

ROUNDS = 5
# params per tensor, as in bench/weightsync.py: a few MB per tensor, like an LLM's projections
CHUNK = 4 << 20


def _best(fn) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _one_size(params: int) -> dict:
    from streamrl.weightsync.layout import Layout, TensorSpec
    from streamrl.weightsync.transports.shm.segment import HEADER_BYTES, SHM_DIR
    from streamrl.weightsync.transports.shm.slots import ShmReader, ShmWriter

    sizes = [min(CHUNK, params - start) for start in range(0, params, CHUNK)]
    tensors = {f"t{i}": torch.randn(n) for i, n in enumerate(sizes)}
    layout = Layout.build([TensorSpec.of(name, t) for name, t in tensors.items()])
    writer = ShmWriter(f"bench-sum-{uuid.uuid4().hex[:8]}", layout, 2, 5.0)
    reader = ShmReader(writer.name, 5.0)
    try:
        # the bare copies go through a second mapping of the same segment: the same pages
        mapped = np.memmap(SHM_DIR / writer.name, np.uint8, "r+", HEADER_BYTES, writer.stride)
        plain = layout.views(torch.from_numpy(mapped))
        dest = {name: torch.empty_like(t) for name, t in tensors.items()}
        pairs = [(name, name) for name in tensors]
        version = 0

        def write() -> None:
            nonlocal version
            version += 1
            # the writer never reuses the newest slot: two writes leave slot 0 holding `version`
            writer.write(version, tensors)
            version += 1
            writer.write(version, tensors)

        def write_plain() -> None:
            for _ in range(2):
                for name, t in tensors.items():
                    plain[name].copy_(t)

        def read() -> None:
            assert reader.read_into(version - 1, 0, layout, pairs, dest) == "ok"

        def read_plain() -> None:
            for name in tensors:
                dest[name].copy_(plain[name])

        for fn in (write, write_plain, read, read_plain):
            fn()
        out = {"bytes": layout.total_bytes}
        out["write"], out["write_plain"] = _best(write) / 2, _best(write_plain) / 2
        out["read"], out["read_plain"] = _best(read), _best(read_plain)
        plain.clear()
        return out
    finally:
        reader.close()
        writer.close()


def run(quick: bool = False) -> str:
    from bench.__main__ import machine

    torch.set_num_threads(1)
    sizes = [10_000_000] if quick else [10_000_000, 100_000_000]
    command = f"python -m bench --only shm_checksum{' --quick' if quick else ''}"
    lines = [
        "## shm checksums",
        "",
        f"{time.strftime('%Y-%m-%d')} · {machine()} · command: `make bench` (`{command}`) · "
        f"load average {os.getloadavg()[0]:.1f} at start",
        "",
        "The shm transport stores a checksum per tensor (its bytes summed as uint64 words, mixed "
        "with the version) so that a reader on a weakly ordered CPU refuses a copy whose data "
        "does not belong to the stamps it saw. *write* = `ShmWriter.write` (copy into the slot "
        "+ checksum of the slot's tensor), *read* = `ShmReader.read_into` (copy out + checksum "
        "of the copy); *plain* = the same copies alone, same pages, back to back. fp32 tensors "
        f"of 4M parameters, best of {ROUNDS}.",
        "",
        "| params | MB | write plain ms | write ms | write ratio | read plain ms | read ms "
        "| read ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for params in sizes:
        r = _one_size(params)
        lines.append(
            f"| {params / 1e6:.0f}M | {r['bytes'] / 1e6:.0f} | {r['write_plain'] * 1e3:.1f} "
            f"| {r['write'] * 1e3:.1f} | {r['write'] / r['write_plain']:.2f} "
            f"| {r['read_plain'] * 1e3:.1f} | {r['read'] * 1e3:.1f} "
            f"| {r['read'] / r['read_plain']:.2f} |"
        )
    lines += [
        "",
        "Reading it: the checksum is one more pass over each tensor right after its copy, while "
        "the tensor is still in the last-level cache; a tensor larger than that (an embedding) "
        "is copied and summed block by block instead, crossing memory once. xxh3 (`xxhash`, "
        "installed) summed no faster than this word sum on this machine, and the word sum can be "
        "taken on a GPU: the publisher takes it there before the copy to the host, a CUDA actor "
        "on its own copy. The writer's part runs on the publisher's background thread (the "
        "learner pays only its staging copy) and the reader's in the actor's background receive; "
        "the engine's pause (`apply`) pays neither. The machine is shared (2 cores), so rows vary "
        "run to run.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    print(run(parser.parse_args().quick))
