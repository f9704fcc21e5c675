"""The actor-side subscriber: a background thread receives the newest announced version into one staging
copy while generation goes on; the engine takes it between two decode steps (``take_staged``), swaps it
into the live model (``swap_into_model``: the staged storages become the parameters and the old
parameters become the next staging copy, so the engine pauses for pointer swaps, not a copy) and reports
``applied(version, recycled)``.
An engine that fails to apply a lent version hands it back with ``rejected(version)``.

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
from streamrl.configs.schema import Config
from streamrl.weightsync import metrics
from streamrl.weightsync.announce import Announcement, Watcher, read_announcement
from streamrl.weightsync.layout import Layout
from streamrl.weightsync.naming import NameMappingError, map_to_template

log = logging.getLogger(__name__)

# re-read the announcement at least this often even without a notification
IDLE_WAIT_S = 1.0
# a newer version is pending while the engine holds the staging copy
BUSY_WAIT_S = 0.02
# stale/torn shm reads retried at once with the newest announcement
RETRIES = 3


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
    model: torch.nn.Module, tensors: dict[str, torch.Tensor]
) -> tuple[float, dict[str, torch.Tensor]]:
    """Make the staged tensors the model's parameters; returns (seconds, the replaced tensors).

    Hand the replaced tensors back with ``applied(version, recycled=...)``: they
    become the next staging copy, so the actor still holds exactly one copy
    beyond its live weights. A tensor whose dtype, device or shape differs from
    its parameter is copied in place instead (and is itself handed back).
    """
    start = time.perf_counter()
    targets = _model_tensors(model, tensors)
    replaced = {}
    with torch.no_grad():
        for name, staged in tensors.items():
            live = targets[name]
            if (staged.dtype, staged.device, staged.shape) == (live.dtype, live.device, live.shape):
                replaced[name] = live.data
                live.data = staged
            else:
                live.copy_(staged)
                replaced[name] = staged
    return time.perf_counter() - start, replaced


class Subscriber:
    def __init__(
        self,
        cfg: Config,
        actor_id: str,
        template: dict[str, torch.Tensor],
        client: redis.Redis | None = None,
        initial_version: int = 0,
    ):
        self.cfg = cfg
        self.actor_id = actor_id
        self.keys = Keys.from_config(cfg)
        self.client = client or connect_sync(cfg.broker, cfg.run.dir)
        self.template = dict(template)
        self.transport = cfg.weightsync.transport
        self.timeout_s = cfg.weightsync.timeout_s
        self._cond = threading.Condition()
        self._state = "empty"
        self._staging: dict[str, torch.Tensor] = {}
        self._staging_key: tuple | None = None
        self._staged_version: int | None = None
        self._live_version = initial_version
        self._live_publisher: str | None = None
        self._staged_publisher: str | None = None
        self._announced: Announcement | None = None
        self._failed: tuple[str, int] | None = None
        self._reader = None
        self._receiver = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures: dict[str, int] = {}
        self.last_error: str | None = None
        self.last_receive_seconds: float | None = None

    @classmethod
    def from_config(
        cls, cfg: Config, actor_id: str, template: dict[str, torch.Tensor]
    ) -> Subscriber:
        return cls(cfg, actor_id, template)

    # engine-facing, non-blocking

    def start(self) -> Subscriber:
        if self._thread is None and self.transport != "none":
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
                if recycled is not None:
                    if recycled.keys() != self._staging.keys():
                        raise ValueError(
                            "recycled tensors must be exactly the ones take_staged lent"
                        )
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
        for part in (self._reader, self._receiver):
            if part is not None:
                part.close()
        self._reader = self._receiver = None

    # background thread

    def _fail(self, reason: str, detail: str = "") -> None:
        self.failures[reason] = self.failures.get(reason, 0) + 1
        metrics.TRANSFER_FAILURES.labels(reason=reason).inc()
        if detail:
            # torch errors carry C++ stack traces: keep the first line
            self.last_error = f"{reason}: {detail.splitlines()[0][:300]}"
            log.warning("weightsync subscriber %s: %s", self.actor_id, self.last_error)

    def _run(self) -> None:
        watcher = None
        while not self._stop.is_set():
            try:
                if watcher is None:
                    watcher = Watcher(self.client, self.keys)
                self._announced = read_announcement(self.client, self.keys) or self._announced
                if self.transport == "dist":
                    self._dist_step()
                    continue
                pending = self._shm_step()
                watcher.wait(BUSY_WAIT_S if pending else IDLE_WAIT_S)
            except redis.RedisError as exc:
                self._fail("redis", repr(exc))
                self._stop.wait(1.0)
            except Exception as exc:
                # keep the thread alive: the actor keeps its weights and reports the error
                self._fail("error", repr(exc))
                self._stop.wait(1.0)
        if watcher is not None:
            watcher.close()

    def _wanted(self, ann: Announcement | None) -> bool:
        if (
            ann is None
            or ann.transport != self.transport
            or self._failed == (ann.publisher, ann.version)
        ):
            return False
        with self._cond:
            if self._state == "ready" and self._staged_publisher == ann.publisher:
                return ann.version > self._staged_version
            # a restarted learner (new publisher id) is authoritative even if it restarted the count
            return ann.publisher != self._live_publisher or ann.version > self._live_version

    def _begin_fill(
        self, layout: Layout, aliases: dict[str, str], wait_s: float = 0.0
    ) -> dict[str, torch.Tensor] | None:
        """Claim the staging copy for writing (allocated for this layout); None while the engine holds it."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._state != "lent", timeout=wait_s):
                return None
            self._state = "filling"
        key = (layout.specs, tuple(sorted(aliases.items())))
        if key != self._staging_key:
            published = {s.name: s.shape for s in layout.specs}
            dtypes = {s.name: s.torch_dtype for s in layout.specs}
            try:
                self._pairs = map_to_template(published, aliases, self.template)
            except NameMappingError:
                self._end_fill(None, None)
                raise
            self._staging = {
                engine: torch.empty(
                    self.template[engine].shape,
                    dtype=dtypes[source],
                    device=self.template[engine].device,
                )
                for engine, source in self._pairs
            }
            self._staging_key = key
        return self._staging

    def _end_fill(self, version: int | None, publisher: str | None) -> None:
        with self._cond:
            if version is None:
                self._state = "empty"
            else:
                self._state, self._staged_version, self._staged_publisher = (
                    "ready",
                    version,
                    publisher,
                )
            self._cond.notify_all()

    def _shm_step(self) -> bool:
        """Receive the newest announced shm version if wanted; returns True if one is still pending."""
        from streamrl.weightsync.shm import ShmReader

        for _ in range(RETRIES):
            ann = self._announced
            if not self._wanted(ann):
                return False
            layout = Layout.from_json(ann.meta["layout"])
            if self._reader is None or self._reader.name != ann.meta["segment"]:
                if self._reader is not None:
                    self._reader.close()
                    self._reader = None
                try:
                    self._reader = ShmReader(ann.meta["segment"], self.timeout_s)
                except FileNotFoundError:
                    self._failed = (ann.publisher, ann.version)
                    self._fail(
                        "segment_gone",
                        f"{ann.meta['segment']} is gone (publisher exited); keeping version {self._live_version}",
                    )
                    return False
            start = time.perf_counter()
            try:
                dest = self._begin_fill(layout, ann.meta["aliases"])
            except NameMappingError as exc:
                self._failed = (ann.publisher, ann.version)
                self._fail("name_mismatch", str(exc))
                return False
            if dest is None:
                return True
            result = "error"
            try:
                result = self._reader.read_into(
                    ann.version, int(ann.meta["slot"]), layout, self._pairs, dest
                )
            finally:
                self._end_fill(ann.version if result == "ok" else None, ann.publisher)
            if result == "ok":
                self.last_receive_seconds = time.perf_counter() - start
                metrics.RECEIVE_SECONDS.observe(self.last_receive_seconds)
                return False
            self._fail("torn" if result == "torn" else "stale_slot")
            self._announced = read_announcement(self.client, self.keys) or ann
        return True

    def _dist_step(self) -> None:
        from streamrl.weightsync.dist import DistReceiver

        if self._receiver is None:
            self._receiver = DistReceiver(
                self.client, self.keys, self.actor_id, timeout_s=self.timeout_s
            )
        started = {}

        def acquire(version: int, layout: Layout, aliases: dict[str, str]):
            started["t"] = time.perf_counter()
            # a broadcast is always the newest version; the engine's swap takes milliseconds, so wait a
            # little for it rather than drop the version (the publisher waits for every member anyway)
            try:
                dest = self._begin_fill(layout, aliases, wait_s=min(1.0, self.timeout_s / 4))
            except NameMappingError as exc:
                # still take part in the broadcast (dropping the bytes) so the publisher is not stalled
                self._fail("name_mismatch", str(exc))
                return None
            if dest is None:
                self._fail("staging_busy")
            return (
                None if dest is None else {source: dest[engine] for engine, source in self._pairs}
            )

        def release(version: int, ok: bool) -> None:
            publisher = self._announced.publisher if self._announced is not None else None
            if ok:
                self.last_receive_seconds = time.perf_counter() - started["t"]
                metrics.RECEIVE_SECONDS.observe(self.last_receive_seconds)
            if self._state == "filling":
                self._end_fill(version if ok else None, publisher)

        try:
            self._receiver.step(0.2, acquire, release)
        except Exception as exc:
            self._fail("timeout" if "timeout" in str(exc).lower() else "error", repr(exc))
