"""The actor-side subscriber: a background thread receives the newest announced version into one staging
copy while generation goes on; the engine takes it between two decode steps (``take_staged``), swaps it
into the live model (``swap_into_model``: the staged storages become the parameters and the old
parameters become the next staging copy, so the engine pauses for pointer swaps, not a copy; an engine
decoding with CUDA graphs copies in place instead and hands the staged tensors back) and reports
``applied(version, recycled)``.
An engine that fails to apply a lent version hands it back with ``rejected(version)``.
How a version's bytes arrive is the transport's receiver's job (``weightsync.transports``); it stages
them through the receiver-facing methods here (``transports.Staging``).

Staging states: empty -> filling -> ready -> lent (engine copying) -> empty.
The thread only writes while the copy is not lent, so there is never more
than one copy beyond the live weights. A version that arrives while an older
one is staged but not yet taken replaces it (an actor that fell behind jumps
straight to the newest). Nothing here blocks the engine, and no wait is
unbounded: if the publisher dies, the actor keeps its weights and ``lag`` /
``seconds_since_announcement`` say so.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
import torch

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.configs.schema import BrokerConfig, RunConfig, WeightSyncConfig
from streamrl.weightsync import metrics, transports
from streamrl.weightsync.announce import Announcement, Watcher, read_announcement
from streamrl.weightsync.layout import Layout
from streamrl.weightsync.naming import NameMappingError, map_to_template
from streamrl.weightsync.transports import Fill, Receiver

log = logging.getLogger(__name__)


def _model_tensors(
    model: torch.nn.Module, tensors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers by name; every staged name must be one of them."""
    targets = dict(model.named_parameters())
    targets.update(model.named_buffers())
    unknown = sorted(set(tensors) - set(targets))
    if unknown:
        raise KeyError(
            f"staged tensors the model does not have: {unknown[:10]}{' ...' if len(unknown) > 10 else ''}"
        )
    return targets


def swap_into_model(
    model: torch.nn.Module,
    tensors: dict[str, torch.Tensor],
    targets: dict[str, torch.Tensor] | None = None,
    in_place: bool = False,
) -> tuple[float, dict[str, torch.Tensor]]:
    """Make the staged tensors the model's parameters; returns (seconds, the replaced tensors).

    ``targets`` names the parameters by staged name when those are not the model's own names (a
    LoRA adapter's, ``policy.lora.adapter_targets``); None = the model's parameters and buffers.

    Hand the replaced tensors back with ``applied(version, recycled=...)``: they
    become the next staging copy, so the actor still holds exactly one copy
    beyond its live weights. A tensor whose dtype, device or shape differs from
    its parameter is copied in place instead (and is itself handed back).
    ``in_place`` copies every tensor so, keeping each parameter's storage (a captured CUDA
    graph reads the parameters by address); the staged tensors are then what is handed back.
    """
    start = time.perf_counter()
    targets = _model_tensors(model, tensors) if targets is None else targets
    replaced = {}
    copies: list[tuple[torch.Tensor, torch.Tensor]] = []
    with torch.no_grad():
        for name, staged in tensors.items():
            live = targets[name]
            swappable = (staged.dtype, staged.device) == (live.dtype, live.device)
            if swappable and staged.shape == live.shape and not in_place:
                replaced[name] = live.data
                live.data = staged
            else:
                copies.append((live, staged))
                replaced[name] = staged
        if copies:
            # one foreach call: a model has hundreds of tensors, and a GPU launch each would
            # cost more than their bytes
            torch._foreach_copy_([live for live, _ in copies], [staged for _, staged in copies])
        if in_place:
            # the staged tensors go back to be refilled: the queued copies must have read them
            for device in {targets[name].device for name in tensors}:
                if device.type == "cuda":
                    torch.cuda.current_stream(device).synchronize()
    return time.perf_counter() - start, replaced


class Subscriber:
    def __init__(
        self,
        ws: WeightSyncConfig,
        keys: Keys,
        client: redis.Redis,
        actor_id: str,
        template: dict[str, torch.Tensor],
        initial_version: int = 0,
    ):
        self.ws = ws
        self.actor_id = actor_id
        self.keys = keys
        self.client = client
        self.template = dict(template)
        self.transport = transports.get(ws.transport)
        self.timeout_s = ws.timeout_s
        self._cond = threading.Condition()
        self._state = "empty"
        self._staging: dict[str, torch.Tensor] = {}
        # the one buffer the staging tensors are views of, in the published layout (``begin_fill``
        # with ``flat``), while they still are
        self._flat: torch.Tensor | None = None
        self._staging_key: tuple | None = None
        self._staged_version: int | None = None
        self._live_version = initial_version
        self._live_publisher: str | None = None
        self._staged_publisher: str | None = None
        # where the live and the staged weights were read (``live_source``)
        self._live_source = ""
        self._staged_source = ""
        self._announced: Announcement | None = None
        self._failed: tuple[str, int] | None = None
        self._pairs: list[tuple[str, str]] = []
        self._receiver: Receiver | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures: dict[str, int] = {}
        self.last_error: str | None = None
        self.last_receive_seconds: float | None = None

    @classmethod
    def from_config(
        cls,
        ws: WeightSyncConfig,
        broker: BrokerConfig,
        run: RunConfig,
        actor_id: str,
        template: dict[str, torch.Tensor],
    ) -> Subscriber:
        return cls(
            ws, Keys.from_config(run, broker), connect_sync(broker, run.dir), actor_id, template
        )

    # engine-facing, non-blocking

    def start(self) -> Subscriber:
        if self._thread is None and self.transport.publishes:
            self._thread = threading.Thread(
                target=self._run, name=f"weightsync-{self.actor_id}", daemon=True
            )
            self._thread.start()
        return self

    def poll(self) -> int | None:
        """Newest version announced by the publisher (None before the first announcement)."""
        ann = self._announced
        return None if ann is None else ann.version

    @property
    def version(self) -> int:
        """Version of the live weights (the last ``applied``)."""
        return self._live_version

    @property
    def live_source(self) -> str:
        """Where the live weights were read: the shm segment's name (it names the host and the
        process that wrote it), "" before any or where the transport reads none."""
        return self._live_source

    @property
    def lag(self) -> int:
        """Versions the live weights are behind the newest announcement."""
        newest = self.poll()
        return 0 if newest is None else max(0, newest - self._live_version)

    @property
    def seconds_since_announcement(self) -> float | None:
        ann = self._announced
        return None if ann is None else max(0.0, time.time() - ann.published_at)

    def take_staged(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        """The staged (version, tensors by engine name), lent to the caller until ``applied``; else None.

        The tensors are the reused staging buffers: swap them into the model
        (``swap_into_model``) or copy them, and keep no reference after ``applied``.
        """
        with self._cond:
            if self._state != "ready":
                return None
            self._state = "lent"
            return self._staged_version, self._staging

    def applied(self, version: int, recycled: dict[str, torch.Tensor] | None = None) -> None:
        """The engine now runs ``version``; the staging copy (or ``recycled``, what a swap replaced) is free."""
        with self._cond:
            if self._state == "lent":
                if version == self._staged_version:
                    self._live_publisher = self._staged_publisher
                    self._live_source = self._staged_source
                if recycled is not None:
                    if recycled.keys() != self._staging.keys():
                        raise ValueError(
                            "recycled tensors must be exactly the ones take_staged lent"
                        )
                    if any(recycled[k] is not self._staging[k] for k in recycled):
                        # swapped in: the old parameters are the staging copy now, not views
                        self._flat = None
                    self._staging = recycled
                self._state = "empty"
            self._live_version = version
            self._cond.notify_all()

    def rejected(self, version: int) -> None:
        """The engine could not apply the lent ``version``: the staging copy is free again, the live
        weights and version stay as they were, and this version is not received again (a newer one is)."""
        with self._cond:
            if self._state == "lent":
                if version == self._staged_version:
                    self._failed = (self._staged_publisher, version)
                self._state = "empty"
            self._cond.notify_all()

    @property
    def staged_version(self) -> int | None:
        """The version staged and ready for ``take_staged`` (None while empty, filling or lent)."""
        with self._cond:
            return self._staged_version if self._state == "ready" else None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None

    # receiver-facing (``transports.Staging``), on the background thread

    @property
    def announced(self) -> Announcement | None:
        return self._announced

    def reread(self) -> None:
        self._announced = read_announcement(self.client, self.keys) or self._announced

    def fail(self, reason: str, detail: str = "", skip: Announcement | None = None) -> None:
        if skip is not None:
            self._failed = (skip.publisher, skip.version)
        self.failures[reason] = self.failures.get(reason, 0) + 1
        metrics.TRANSFER_FAILURES.labels(reason=reason).inc()
        if detail:
            # torch errors carry C++ stack traces: keep the first line
            self.last_error = f"{reason}: {detail.splitlines()[0][:300]}"
            log.warning("weightsync subscriber %s: %s", self.actor_id, self.last_error)

    def wanted(self, reread: bool = False) -> Announcement | None:
        if reread:
            self.reread()
        ann = self._announced
        return ann if self._wants(ann) else None

    def _wants(self, ann: Announcement | None) -> bool:
        if (
            ann is None
            or ann.transport != self.transport.name
            or self._failed == (ann.publisher, ann.version)
        ):
            return False
        with self._cond:
            if self._state == "ready" and self._staged_publisher == ann.publisher:
                return ann.version > self._staged_version
            # a restarted learner (new publisher id) is authoritative even if it restarted the count
            return ann.publisher != self._live_publisher or ann.version > self._live_version

    @property
    def flat(self) -> torch.Tensor | None:
        """The staging copy as one buffer in the published layout (its tensors are views of it),
        or None: then only the tensors by engine name are."""
        return self._flat

    def begin_fill(
        self, layout: Layout, aliases: dict[str, str], wait_s: float = 0.0, flat: bool = False
    ) -> Fill | None:
        """Claim the staging copy for writing (allocated for this layout); None while the engine holds it.

        ``flat``: allocate it as views of one zeroed buffer in ``layout`` (``flat``), so a
        receiver copies a version in one piece, where every published tensor is staged once, as
        it is published, on one device; an engine that swaps the staged tensors in for its
        parameters then hands back separate ones, and the copy stays so."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._state != "lent", timeout=wait_s):
                return None
            self._state = "filling"
        key = (layout.specs, tuple(sorted(aliases.items())), flat)
        if key != self._staging_key:
            published = {s.name: s.shape for s in layout.specs}
            dtypes = {s.name: s.torch_dtype for s in layout.specs}
            try:
                self._pairs = map_to_template(published, aliases, self.template)
            except NameMappingError:
                self.end_fill(None, None)
                raise
            self._flat = self._flat_staging(layout) if flat else None
            if self._flat is not None:
                views = layout.views(self._flat)
                self._staging = {engine: views[source] for engine, source in self._pairs}
            else:
                self._staging = {
                    engine: torch.empty(
                        self.template[engine].shape,
                        dtype=dtypes[source],
                        device=self.template[engine].device,
                    )
                    for engine, source in self._pairs
                }
            self._staging_key = key
        return Fill(self._staging, self._pairs, self._flat)

    def _flat_staging(self, layout: Layout) -> torch.Tensor | None:
        """One zeroed buffer for ``layout`` on the engine's device, if the pairs allow it: each
        published tensor staged once, in its published shape, all on one device."""
        sources = [source for _, source in self._pairs]
        shapes = {s.name: s.shape for s in layout.specs}
        devices = {self.template[engine].device for engine, _ in self._pairs}
        if (
            len(set(sources)) != len(sources)
            or len(devices) != 1
            or any(tuple(self.template[e].shape) != shapes[src] for e, src in self._pairs)
        ):
            return None
        return torch.zeros(layout.padded_bytes, dtype=torch.uint8, device=devices.pop())

    def end_fill(
        self,
        version: int | None,
        publisher: str | None,
        seconds: float | None = None,
        source: str = "",
    ) -> None:
        if seconds is not None:
            self.last_receive_seconds = seconds
            metrics.RECEIVE_SECONDS.observe(seconds)
        with self._cond:
            if version is None:
                self._state = "empty"
            else:
                self._state, self._staged_version, self._staged_publisher = (
                    "ready",
                    version,
                    publisher,
                )
                self._staged_source = source
            self._cond.notify_all()

    # background thread

    def _run(self) -> None:
        watcher = None
        while not self._stop.is_set():
            try:
                if watcher is None:
                    watcher = Watcher(self.client, self.keys)
                if self._receiver is None:
                    self._receiver = self.transport.receiver(
                        self.ws, self.client, self.keys, self.actor_id
                    )
                self.reread()
                wait_s = self._receiver.step(self)
                if wait_s > 0:
                    watcher.wait(wait_s)
            except redis.RedisError as exc:
                self.fail("redis", repr(exc))
                self._stop.wait(1.0)
            except Exception as exc:
                # keep the thread alive: the actor keeps its weights and reports the error
                self.fail("error", repr(exc))
                self._stop.wait(1.0)
        if watcher is not None:
            watcher.close()
