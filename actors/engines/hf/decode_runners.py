"""How the hf engine's static decode step runs: eagerly, or captured as one CUDA graph per batch size.

A step function ``step(bucket) -> logits`` reads and writes only static tensors (the slots' KV
rows, next tokens and positions, the parameters), so a graph captured once per bucket replays it
with whatever those tensors hold: one launch instead of hundreds of small kernels from Python.
Both runners take the same function, so the CPU tests of the eager runner test what a graph
replays. These are the only CUDA-specific lines of the engine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

Step = Callable[[int], torch.Tensor]

# eager runs of a step on a side stream before its capture: the first run of a kernel may
# allocate or autotune (cuBLAS workspaces), which a capture must not record (torch.cuda.graphs)
WARMUP_RUNS = 3


class EagerRunner:
    """Runs the step as it is (CPU, or ``actor.hf.cuda_graphs: off`` on a static batch)."""

    # nothing holds tensor addresses: a weight swap may replace parameter storages
    holds_addresses = False

    def __init__(self, step: Step) -> None:
        self.step = step

    def __call__(self, bucket: int) -> torch.Tensor:
        return self.step(bucket)

    def reset(self) -> None:
        """Nothing is kept between steps."""


class GraphRunner:
    """One CUDA graph per bucket, captured at its first use and replayed after.

    Every graph shares one memory pool (their steps never run at once). The step's tensors are
    baked into the graphs by address: reallocating one (a longer KV cache) needs ``reset``, and
    weights must be copied into the live parameters, never swapped for other storages."""

    holds_addresses = True

    def __init__(self, step: Step, device: torch.device) -> None:
        self.step = step
        self.device = device
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # the logits each graph writes at every replay
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        # why capture failed (then every step runs eagerly), None while it works
        self.failed: str | None = None

    def __call__(self, bucket: int) -> torch.Tensor:
        if self.failed is not None:
            return self.step(bucket)
        graph = self.graphs.get(bucket)
        if graph is None:
            try:
                graph = self._capture(bucket)
            # an op this torch or transformers cannot capture: decode on without graphs (the
            # static batch stays, so the weights keep being copied in place) and say why, once
            except RuntimeError as exc:
                self.failed = f"{type(exc).__name__}: {exc}".splitlines()[0]
                log.warning("CUDA graph capture failed, decoding without graphs: %s", self.failed)
                self.reset()
                torch.cuda.synchronize(self.device)
                return self.step(bucket)
        graph.replay()
        return self.outputs[bucket]

    def reset(self) -> None:
        """Drop every graph (and with the last of them their pool)."""
        self.graphs.clear()
        self.outputs.clear()
        self.pool = None

    def _capture(self, bucket: int) -> torch.cuda.CUDAGraph:
        # a step writes each live row's key and value at the row's position, the same ones the
        # replay writes: the warm-up runs change nothing the decode reads
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self.step(bucket)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the weightsync subscriber's thread may allocate or copy on the GPU meanwhile
        # (on streams of its own); only this thread's calls must be capture-safe
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            self.outputs[bucket] = self.step(bucket)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bucket] = graph
        return graph
