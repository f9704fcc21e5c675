"""torch.distributed transport: the publisher broadcasts the flat weight layout in fixed-size buckets
to the actors in a process group of its own (NCCL on GPUs, the same code on gloo on CPU).

The group is separate from the learner's DeepSpeed world: it is built
directly from a ``TCPStore`` that the publisher hosts on a fresh port for
every membership ("epoch"), so actors can join and leave between versions.

Rendezvous through Redis:
- actors heartbeat ``{weights}:dist:members`` (hash: actor id -> expiry time);
- before a publish, if the live membership changed (or the last broadcast
  failed), the publisher opens a new store, writes ``{weights}:dist:group``
  (epoch, host, port, backend, member ranks) and notifies; each member checks
  in (``ready/{rank}``) and builds the group. Members that do not check in
  within ``timeout_s`` are dropped and the group is formed without them;
- each publish puts ``pub/{seq}`` (version, layout, aliases) into the store,
  then broadcasts the buckets. Every collective waits at most ``timeout_s``; a
  failure marks the group broken, and the next attempt re-forms it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
import torch
import torch.distributed as tdist

from streamrl.broker.client import as_str
from streamrl.broker.keys import Keys
from streamrl.broker.server import is_loopback
from streamrl.weightsync import metrics
from streamrl.weightsync.layout import Layout
from streamrl.weightsync.transports.base import TransferTimeout

log = logging.getLogger(__name__)

# per bucket: (tensor name, first byte in tensor, end byte in tensor, offset in bucket)
Window = list[tuple[str, int, int, int]]


def windows(layout: Layout, bucket_bytes: int) -> list[Window]:
    """Cut the layout's byte stream into consecutive buckets of ``bucket_bytes`` (the last may be shorter).

    Alignment gaps between tensors travel as padding; a tensor larger than a
    bucket spans several. Publisher and members compute the same plan.
    """
    if bucket_bytes <= 0:
        raise ValueError("bucket_bytes must be positive")
    plan: list[Window] = [[] for _ in range(-(-layout.total_bytes // bucket_bytes))]
    for spec, offset in zip(layout.specs, layout.offsets, strict=True):
        start, end = offset, offset + spec.nbytes
        while start < end:
            index = start // bucket_bytes
            stop = min(end, (index + 1) * bucket_bytes)
            plan[index].append(
                (spec.name, start - offset, stop - offset, start - index * bucket_bytes)
            )
            start = stop
    return plan


def bucket_sizes(layout: Layout, bucket_bytes: int) -> list[int]:
    n = -(-layout.total_bytes // bucket_bytes)
    return [min(bucket_bytes, layout.total_bytes - i * bucket_bytes) for i in range(n)]


def resolve_backend(backend: str) -> str:
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return backend


def _device(backend: str) -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if backend == "nccl"
        else torch.device("cpu")
    )


def make_group(
    backend: str, store: tdist.Store, rank: int, size: int, timeout_s: float, host: str = ""
):
    """A process group outside the default world. The only NCCL-specific lines of the transport.

    gloo's pair listeners bind ``host`` when it is a loopback address (a one-host run keeps every
    socket on loopback); otherwise gloo picks the address this host's name resolves to.
    """
    timeout = dt.timedelta(seconds=timeout_s)
    if backend == "gloo":
        options = tdist.ProcessGroupGloo._Options()
        options._timeout = timeout
        device_host = host if is_loopback(host) else ""
        options._devices = [tdist.ProcessGroupGloo.create_device(hostname=device_host)]
        return tdist.ProcessGroupGloo(store, rank, size, options)
    options = tdist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return tdist.ProcessGroupNCCL(store, rank, size, options)


def bound_store(host: str, timeout_s: float) -> tdist.TCPStore:
    """A master TCPStore on a fresh port of ``host`` only.

    TCPStore binds every interface ([::]) on its own whatever host it is given; a socket bound
    here and handed over as ``master_listen_fd`` keeps it where ``weightsync.dist_host`` says.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as listener:
        listener.bind((host, 0))
        listener.listen()
        port = listener.getsockname()[1]
        # The store's server owns the descriptor from here on (it does not copy it).
        fd = listener.detach()
    return tdist.TCPStore(
        host,
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=dt.timedelta(seconds=timeout_s),
        master_listen_fd=fd,
    )


@contextmanager
def bounded(what: str, timeout_s: float) -> Iterator[None]:
    """Run a step torch bounds by ``timeout_s``; its failure after that long raises ``TransferTimeout``.

    gloo and NCCL report a timed-out collective and a lost peer alike as a ``RuntimeError`` (gloo:
    "Operation timed out!"), and the store's connect retries until its timeout: the time the
    step ran is what tells a timeout from an earlier failure.
    """
    start = time.monotonic()
    try:
        yield
    except RuntimeError as exc:
        if time.monotonic() - start >= timeout_s:
            raise TransferTimeout(f"{what}: no progress within {timeout_s:g} s ({exc})") from exc
        raise


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


class DistSender:
    """Publisher side (rank 0 of every epoch's group)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        layout: Layout,
        *,
        bucket_bytes: int,
        timeout_s: float,
        backend: str,
        host: str,
    ):
        self.client, self.keys, self.layout = client, keys, layout
        self.bucket_bytes, self.timeout_s, self.host = bucket_bytes, timeout_s, host
        self.backend = resolve_backend(backend)
        self.device = _device(self.backend)
        self.plan = windows(layout, bucket_bytes)
        self.sizes = bucket_sizes(layout, bucket_bytes)
        self.bucket = torch.empty(max(self.sizes, default=0), dtype=torch.uint8, device=self.device)
        self.epoch = int(client.get(keys.weights_dist_epoch) or 0)
        self.members: list[str] = []
        self.store: tdist.TCPStore | None = None
        self.group = None
        self.seq = 0
        self.broken = True

    def live_members(self) -> list[str]:
        now = time.time()
        raw = self.client.hgetall(self.keys.weights_dist_members)
        live, expired = [], []
        for member, expiry in raw.items():
            member = as_str(member)
            (live if float(expiry) > now else expired).append(member)
        if expired:
            self.client.hdel(self.keys.weights_dist_members, *expired)
        return sorted(live)

    def _announce_group(self, members: list[str]) -> None:
        record = {
            "epoch": self.epoch,
            "host": self.host,
            "port": self.store.port,
            "backend": self.backend,
            "members": members,
        }
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self.keys.weights_dist_group, json.dumps(record))
        pipe.set(self.keys.weights_dist_epoch, self.epoch)
        pipe.publish(self.keys.weights_notify, f"group {self.epoch}")
        pipe.execute()

    def _close_group(self) -> None:
        self.group = None
        # the master store's server stops with it, so members of the old epoch get errors
        self.store = None
        self.members = []

    def reform(self, members: list[str]) -> None:
        """New epoch for ``members``; drops those that do not check in within timeout_s (bounded retries)."""
        self._close_group()
        for _ in range(3):
            self.epoch += 1
            self.store = bound_store(self.host, self.timeout_s)
            self._announce_group(members)
            if not members:
                break
            missing = self._wait_ready(members)
            if not missing:
                prefix = tdist.PrefixStore(f"e{self.epoch}/pg/", self.store)
                try:
                    self.group = make_group(
                        self.backend, prefix, 0, len(members) + 1, self.timeout_s, self.host
                    )
                # a member died between check-in and connect
                except Exception as exc:
                    metrics.TRANSFER_FAILURES.labels(reason="rendezvous").inc()
                    log.warning("weightsync dist: epoch %d failed to form: %s", self.epoch, exc)
                break
            log.warning(
                "weightsync dist: %s did not join epoch %d within %.1fs; dropped",
                missing,
                self.epoch,
                self.timeout_s,
            )
            metrics.TRANSFER_FAILURES.labels(reason="peer_dropped").inc(len(missing))
            self.client.hdel(self.keys.weights_dist_members, *missing)
            members = [m for m in members if m not in missing]
        self.members = members if self.group is not None else []
        self.seq = 0
        # retried at the next publish
        self.broken = self.group is None and bool(members)

    def _wait_ready(self, members: list[str]) -> list[str]:
        deadline = time.monotonic() + self.timeout_s
        keys = [f"e{self.epoch}/ready/{rank}" for rank in range(1, len(members) + 1)]
        while time.monotonic() < deadline:
            if self.store.check(keys):
                return []
            time.sleep(0.01)
        return [m for m, k in zip(members, keys, strict=True) if not self.store.check([k])]

    def send(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        aliases: dict[str, str],
        checksums: dict[str, int] | None = None,
    ) -> dict:
        """Broadcast one version to the current members; a failure re-forms the group and retries once."""
        for attempt in range(2):
            live = self.live_members()
            if self.broken or live != self.members:
                self.reform(live)
            if self.group is None:
                return {"epoch": self.epoch, "members": []}
            try:
                self._broadcast(version, tensors, aliases)
                return {"epoch": self.epoch, "members": self.members}
            except Exception as exc:
                reason = "timeout" if isinstance(exc, TransferTimeout) else "error"
                metrics.TRANSFER_FAILURES.labels(reason=reason).inc()
                log.warning(
                    "weightsync dist: broadcast of version %d failed (attempt %d): %s",
                    version,
                    attempt + 1,
                    exc,
                )
                self.broken = True
        return {"epoch": self.epoch, "members": []}

    def _broadcast(
        self, version: int, tensors: dict[str, torch.Tensor], aliases: dict[str, str]
    ) -> None:
        header = {
            "version": version,
            "layout": self.layout.to_json(),
            "aliases": aliases,
            "bucket_bytes": self.bucket_bytes,
        }
        self.store.set(f"e{self.epoch}/pub/{self.seq}", json.dumps(header))
        self.seq += 1
        timeout = dt.timedelta(seconds=self.timeout_s)
        dtypes = {s.name: s.torch_dtype for s in self.layout.specs}
        converted_name, converted = None, None
        with torch.no_grad():
            for size, window in zip(self.sizes, self.plan, strict=True):
                bucket = self.bucket[:size]
                for name, start, end, at in window:
                    # a tensor spanning buckets is converted once
                    if name != converted_name:
                        converted_name = name
                        converted = _bytes_of(
                            tensors[name].detach().to(self.device, dtypes[name]).contiguous()
                        )
                    bucket[at : at + end - start].copy_(converted[start:end])
                with bounded(f"broadcast of version {version}", self.timeout_s):
                    self.group.broadcast([bucket], tdist.BroadcastOptions()).wait(timeout)

    def close(self) -> None:
        self._close_group()


class DistReceiver:
    """Member side, driven by the subscriber's background thread through ``step``."""

    def __init__(self, client: redis.Redis, keys: Keys, actor_id: str, *, timeout_s: float):
        self.client, self.keys, self.actor_id = client, keys, actor_id
        self.timeout_s = timeout_s
        self.bucket = torch.empty(0, dtype=torch.uint8)
        self.epoch: int | None = None
        self.failed_epoch: int | None = None
        self.store = None
        self.group = None
        self.device = torch.device("cpu")
        self.seq = 0
        self._next_beat = 0.0

    def heartbeat(self) -> None:
        now = time.time()
        if now >= self._next_beat:
            self.client.hset(self.keys.weights_dist_members, self.actor_id, now + self.timeout_s)
            self._next_beat = now + self.timeout_s / 4

    def _leave(self) -> None:
        self.group = self.store = None
        self.epoch = None

    def _join_if_listed(self) -> None:
        raw = self.client.get(self.keys.weights_dist_group)
        if raw is None:
            return
        record = json.loads(raw)
        epoch = int(record["epoch"])
        if epoch == self.epoch or epoch == self.failed_epoch:
            return
        self._leave()
        if self.actor_id not in record["members"]:
            return
        rank = record["members"].index(self.actor_id) + 1
        timeout = dt.timedelta(seconds=self.timeout_s)
        with bounded(f"connecting to epoch {epoch}'s store", self.timeout_s):
            self.store = tdist.TCPStore(
                record["host"], int(record["port"]), is_master=False, timeout=timeout
            )
        self.store.set(f"e{epoch}/ready/{rank}", "1")
        backend = record["backend"]
        self.device = _device(backend)
        try:
            with bounded(f"forming epoch {epoch}'s group", self.timeout_s):
                self.group = make_group(
                    backend,
                    tdist.PrefixStore(f"e{epoch}/pg/", self.store),
                    rank,
                    len(record["members"]) + 1,
                    self.timeout_s,
                    record["host"],
                )
        except Exception:
            self.failed_epoch = epoch
            self._leave()
            raise
        self.epoch, self.seq = epoch, 0

    def step(self, wait_s: float, acquire, release) -> int | None:
        """Join a new epoch if listed, then wait up to ``wait_s`` for the next publish and receive it.

        ``acquire(version, layout, aliases)`` returns destination tensors by
        published name, or None to receive and drop (staging busy);
        ``release(version, ok)`` is called after. Returns the version received.
        """
        self.heartbeat()
        self._join_if_listed()
        if self.group is None:
            time.sleep(wait_s)
            return None
        key = f"e{self.epoch}/pub/{self.seq}"
        try:
            self.store.wait([key], dt.timedelta(seconds=wait_s))
        except tdist.DistNetworkError:
            # the publisher (and its store) is gone: wait for a new epoch
            self.failed_epoch = self.epoch
            self._leave()
            return None
        # timeout: nothing published yet
        except tdist.DistStoreError:
            return None
        header = json.loads(self.store.get(key))
        self.seq += 1
        layout = Layout.from_json(header["layout"])
        version = int(header["version"])
        dest = acquire(version, layout, header["aliases"])
        ok = False
        try:
            self._receive(layout, int(header["bucket_bytes"]), dest)
            ok = dest is not None
        except Exception:
            self.failed_epoch = self.epoch
            self._leave()
            raise
        finally:
            release(version, ok)
        return version if ok else None

    def _receive(
        self, layout: Layout, bucket_bytes: int, dest: dict[str, torch.Tensor] | None
    ) -> None:
        sizes = bucket_sizes(layout, bucket_bytes)
        if self.bucket.device != self.device or self.bucket.numel() < max(sizes, default=0):
            self.bucket = torch.empty(max(sizes, default=0), dtype=torch.uint8, device=self.device)
        bucket = self.bucket
        timeout = dt.timedelta(seconds=self.timeout_s)
        targets = {name: _bytes_of(t) for name, t in dest.items()} if dest is not None else None
        for size, window in zip(sizes, windows(layout, bucket_bytes), strict=True):
            chunk = bucket[:size]
            with bounded(f"epoch {self.epoch} broadcast", self.timeout_s):
                self.group.broadcast([chunk], tdist.BroadcastOptions()).wait(timeout)
            if targets is None:
                continue
            for name, start, end, at in window:
                if name in targets:
                    targets[name][start:end].copy_(chunk[at : at + end - start])

    def close(self) -> None:
        try:
            self.client.hdel(self.keys.weights_dist_members, self.actor_id)
        except redis.RedisError:
            # Redis gone too: the heartbeat expires on its own
            pass
        self._leave()
