"""The learner rank-0 publisher: after an optimizer step, ``submit(version, named_tensors)`` converts the
weights to the actors' engine dtype on their own device into a pre-allocated staging buffer (a GPU's
copy lands in pinned host memory, without waiting for it), and a background thread writes them
through the configured transport and announces the version in Redis (``weights`` hash +
``weights:notify``) so running and late actors find it. ``publish`` is ``submit`` + ``flush``.

``weightsync.staging_buffers`` staging buffers (2): the learner waits only when the next
version's buffer is still being written out (``streamrl_weights_stage_wait_seconds``). Versions are written and announced one at a
time, in the order submitted, each one complete before its announcement, so what actors see is
exactly what a synchronous publish showed them. A transport that is not ``background`` (dist: its
broadcast is a collective with the actors, converting on the way) takes the weights as they are,
before ``submit`` returns.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import redis
import torch

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.configs.errors import StreamRLError
from streamrl.configs.schema import (
    ENGINE_PLACEMENT,
    ActorConfig,
    BrokerConfig,
    ModelConfig,
    RunConfig,
    WeightSyncConfig,
)
from streamrl.policy.load import resolve_dtype
from streamrl.weightsync import metrics, transports
from streamrl.weightsync.announce import announce
from streamrl.weightsync.layout import Layout, TensorSpec
from streamrl.weightsync.naming import canonical_tensors
from streamrl.weightsync.transports import Sender


class PublishError(StreamRLError, RuntimeError):
    """A background publish failed; raised by the next ``submit``/``flush``."""


@dataclass(frozen=True)
class PublishStats:
    version: int
    seconds: float
    bytes: int
    transport: str


def engine_dtype(model: ModelConfig, actor: ActorConfig, engine: str) -> torch.dtype:
    """The dtype one actor engine computes in: on ``actor.device``, or on this host's GPU if it has
    one (``configs.schema.ENGINE_PLACEMENT``; the vLLM CPU build computes in float32)."""
    if ENGINE_PLACEMENT[engine] == "device":
        device = actor.device
    else:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return resolve_dtype(model.dtype, device)


def transfer_dtype(ws: WeightSyncConfig, model: ModelConfig, actor: ActorConfig) -> torch.dtype:
    """``weightsync.dtype``; auto = the dtype the actors' engines compute in.

    Engines that compute in different dtypes (a vLLM actor in bfloat16 on a GPU next to an hf
    actor in float32 on CPU) get float32: each converts it down to what it computes in, as it
    would the learner's own weights, while a half-precision publish would round the float32
    engine's weights.
    """
    if ws.dtype != "auto":
        return resolve_dtype(ws.dtype)
    dtypes = {engine_dtype(model, actor, engine) for engine in actor.engines_in_use}
    return dtypes.pop() if len(dtypes) == 1 else torch.float32


class _Stage:
    """One pre-allocated staging buffer: the layout's bytes on the host (pinned when the weights
    are on a GPU), and ``free`` while no version in it waits to be written out."""

    def __init__(self, layout: Layout, device: torch.device):
        pinned = device.type == "cuda"
        self.flat = torch.empty(layout.total_bytes, dtype=torch.uint8, pin_memory=pinned)
        self.views = layout.views(self.flat)
        self.free = threading.Event()
        self.free.set()

    def fill(self, tensors: dict[str, torch.Tensor]) -> tuple[object, dict | None]:
        """Copy (converting on the tensors' device) into this buffer. Returns what the writer
        waits for before reading it (a CUDA event, or None), and the checksums when a GPU took
        them (``transports.shm.checksum.word_sum``, before the copy; None: the writer sums on the host)."""
        from streamrl.weightsync.transports.shm.checksum import word_sum

        cuda = [t for t in tensors.values() if t.device.type == "cuda"]
        if not cuda:
            with torch.no_grad():
                for name, t in tensors.items():
                    self.views[name].copy_(t)
            return None, None
        names = list(tensors)
        with torch.no_grad():
            sums = torch.empty(len(names), dtype=torch.int64, device=cuda[0].device)
            for i, name in enumerate(names):
                view = self.views[name]
                src = tensors[name].to(view.dtype)
                sums[i] = word_sum(src).to(sums.device)
                view.copy_(src, non_blocking=True)
            host_sums = torch.empty(len(names), dtype=torch.int64, pin_memory=True)
            host_sums.copy_(sums, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(sums.device))
        return done, {"names": names, "sums": host_sums}


@dataclass
class _Job:
    version: int
    tensors: dict[str, torch.Tensor]
    aliases: dict[str, str]
    stage: _Stage | None
    ready: object
    device_sums: dict | None
    submitted: float
    then: Callable[[], None] | None


class Publisher:
    def __init__(
        self,
        ws: WeightSyncConfig,
        keys: Keys,
        client: redis.Redis,
        dtype: torch.dtype | None,
        host_id: str = "",
    ):
        """``host_id``: this host's ``run.host_id`` (the dist transport's relays key by it)."""
        self.ws = ws
        self.host_id = host_id
        self.keys = keys
        self.client = client
        self.transport = transports.get(ws.transport)
        self.dtype = dtype
        self.id = uuid.uuid4().hex[:12]
        self.last_version: int | None = None
        self._layout: Layout | None = None
        self._sender: Sender | None = None
        self._stages: list[_Stage] = []
        self._next_stage = 0
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    @classmethod
    def from_config(
        cls,
        ws: WeightSyncConfig,
        broker: BrokerConfig,
        run: RunConfig,
        dtype: torch.dtype | None = None,
    ) -> Publisher:
        """``dtype``: what floating-point tensors travel in (``transfer_dtype``); None = the
        dtype they are submitted in."""
        return cls(
            ws, Keys.from_config(run, broker), connect_sync(broker, run.dir), dtype, run.host_id
        )

    def _spec(self, name: str, tensor: torch.Tensor) -> TensorSpec:
        # integer/bool tensors (rare in a policy) keep their dtype; floats travel in the engines' dtype
        return TensorSpec.of(name, tensor, self.dtype if tensor.is_floating_point() else None)

    def submit(
        self,
        version: int,
        named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        then: Callable[[], None] | None = None,
    ) -> float:
        """Stage ``version`` for publishing and return; the background thread writes and announces
        it, then calls ``then`` (on that thread). Versions must strictly increase. Returns the
        seconds the caller spent (the staging copy, and any wait for a free buffer). The tensors
        may change as soon as this returns (a GPU's later kernels queue behind the copy)."""
        start = time.perf_counter()
        self._raise_failure()
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be a non-negative int, got {version!r}")
        if self.last_version is not None and version <= self.last_version:
            raise ValueError(
                f"versions must strictly increase: got {version} after {self.last_version}"
            )
        tensors, aliases = canonical_tensors(named_tensors)
        layout = Layout.build([self._spec(name, t) for name, t in tensors.items()])
        if self._layout is None:
            self._open(layout, next(iter(tensors.values())).device)
        elif layout != self._layout:
            raise ValueError(
                "published tensors changed names, shapes or dtypes since the first publish; a publisher serves one model"
            )
        if self.transport.background:
            stage = self._stages[self._next_stage]
            self._next_stage = (self._next_stage + 1) % len(self._stages)
            if not stage.free.is_set():
                metrics.STAGE_WAITS.inc()
                waited = time.perf_counter()
                self._wait(stage.free)
                metrics.STAGE_WAIT_SECONDS.observe(time.perf_counter() - waited)
            stage.free.clear()
            ready, device_sums = stage.fill(tensors)
            self.last_version = version
            self._jobs.put(
                _Job(version, stage.views, aliases, stage, ready, device_sums, start, then)
            )
        else:
            # the transport converts as it sends: the weights go to it as they are
            self._send(_Job(version, tensors, aliases, None, None, None, start, then))
            self.last_version = version
        seconds = time.perf_counter() - start
        metrics.STAGE_SECONDS.observe(seconds)
        return seconds

    def publish(
        self,
        version: int,
        named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    ) -> PublishStats:
        """Make ``version`` available to every actor, and return once it is announced."""
        start = time.perf_counter()
        self.submit(version, named_tensors)
        self.flush()
        nbytes = self._layout.total_bytes if self.transport.publishes else 0
        return PublishStats(version, time.perf_counter() - start, nbytes, self.transport.name)

    def flush(self) -> None:
        """Wait until every submitted version is announced (and its ``then`` ran); raises
        ``PublishError`` if one failed."""
        if self._thread is not None:
            self._jobs.join()
        self._raise_failure()

    def _open(self, layout: Layout, device: torch.device) -> None:
        self._layout = layout
        self._sender = self.transport.sender(
            self.ws, self.client, self.keys, layout, publisher=self.id, host_id=self.host_id
        )
        if not self.transport.background:
            return
        self._stages = [_Stage(layout, device) for _ in range(self.ws.staging_buffers)]
        self._thread = threading.Thread(
            target=self._write_out, name="weight-publisher", daemon=True
        )
        self._thread.start()

    def _write_out(self) -> None:
        """The background thread: each staged version into the transport, then its announcement."""
        while (job := self._jobs.get()) is not None:
            try:
                if self._failure is None:
                    self._send(job)
            except BaseException as exc:
                self._failure = exc
            finally:
                if job.stage is not None:
                    job.stage.free.set()
                self._jobs.task_done()
        self._jobs.task_done()

    def _send(self, job: _Job) -> None:
        checksums = None
        if job.ready is not None:
            job.ready.synchronize()
        if job.device_sums is not None:
            from streamrl.weightsync.transports.shm.checksum import checksum_of_sum

            names, sums = job.device_sums["names"], job.device_sums["sums"].tolist()
            checksums = {
                name: checksum_of_sum(s, job.version) for name, s in zip(names, sums, strict=True)
            }
        meta = {"layout": self._layout.to_json(), "aliases": job.aliases}
        meta.update(self._sender.send(job.version, job.tensors, job.aliases, checksums))
        announce(self.client, self.keys, job.version, self.transport.name, self.id, meta)
        metrics.PUBLISH_SECONDS.observe(time.perf_counter() - job.submitted)
        metrics.PUBLISH_BYTES.inc(self._layout.total_bytes if self.transport.publishes else 0)
        metrics.PUBLISHED_VERSION.set(job.version)
        if job.then is not None:
            job.then()

    def _wait(self, event: threading.Event) -> None:
        while not event.wait(0.05):
            self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise PublishError(f"publishing weights failed: {self._failure!r}") from self._failure

    def close(self) -> None:
        """Finish what was submitted (a failure is left to ``flush``), then stop the thread and the transport."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        if self._sender is not None:
            self._sender.close()
            self._sender = None
