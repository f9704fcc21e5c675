"""torch.distributed transport: the publisher broadcasts the flat weight layout in fixed-size buckets
to the members of a process group of its own (NCCL on GPUs, the same code on gloo on CPU).

The group is separate from the learner's DeepSpeed world: it is built directly from one
``TCPStore`` the publisher hosts for its lifetime on the first free port of
``weightsync.dist_port``..``+dist_ports-1`` (a range a firewall can allow), so members can join and
leave between versions, each membership an "epoch" under its own key prefix.

Rendezvous through Redis:
- members heartbeat ``{weights}:dist:members`` (hash: member id -> "expiry seen-epoch", the newest
  group record the member has acted on);
- before a publish, if the membership changed (or the last broadcast failed), the publisher writes
  ``{weights}:dist:group`` (epoch, host, port, backend, invited members, its host id) and notifies;
  each invited member checks in (``e{epoch}/ready/{member}``). After all checked in, or
  ``timeout_s`` after the record, the publisher writes ``e{epoch}/final`` (the members that made it,
  in rank order) and builds the group with those alone, so a slow or dead member costs one publish
  at most ``timeout_s`` and never a retry loop. A dropped member is invited again only once its
  heartbeat says it has seen the epoch it was dropped from: a dead or partitioned one is not waited
  for twice, and one that comes back (or restarts, or starts late) joins at the next publish;
- each publish puts ``pub/{seq}`` (version, layout, aliases, publisher id) into the store, then
  broadcasts the buckets. Every collective waits at most ``timeout_s``; a failure marks the group
  broken, and the next publish re-forms it.
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
from streamrl.weightsync.address import toward
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


def make_group(backend: str, store: tdist.Store, rank: int, size: int, timeout_s: float, host: str):
    """A process group outside the default world. The only NCCL-specific lines of the transport.

    gloo's pair listeners bind ``host``, this process's own address toward the others (a one-host
    run keeps every socket on loopback; across hosts, a name may not resolve to the right address).
    """
    timeout = dt.timedelta(seconds=timeout_s)
    if backend == "gloo":
        options = tdist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [tdist.ProcessGroupGloo.create_device(hostname=host)]
        return tdist.ProcessGroupGloo(store, rank, size, options)
    options = tdist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return tdist.ProcessGroupNCCL(store, rank, size, options)


class NoFreePort(OSError):
    pass


def bound_store(host: str, timeout_s: float, first_port: int = 0, ports: int = 1) -> tdist.TCPStore:
    """A master TCPStore on ``host`` only, on the first free port of ``first_port``..``+ports-1``
    (0: any free port).

    TCPStore binds every interface ([::]) on its own whatever host it is given; a socket bound
    here and handed over as ``master_listen_fd`` keeps it where ``weightsync.dist_host`` says.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    candidates = range(first_port, first_port + ports) if first_port else [0]
    errors = []
    for port in candidates:
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            # a restarted learner takes its port back while the old connections linger in TIME_WAIT
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen()
        except OSError as exc:
            listener.close()
            errors.append(f"{port}: {exc.strerror}")
            continue
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
    raise NoFreePort(
        f"weightsync.dist_port: no free port on {host} in {candidates[0]}-{candidates[-1]} "
        f"({'; '.join(errors[:3])}); widen weightsync.dist_ports or move weightsync.dist_port"
    )


def parse_beat(value: bytes | str) -> tuple[float, int]:
    """(expiry, seen epoch) of a member's heartbeat."""
    expiry, _, seen = as_str(value).partition(" ")
    return float(expiry), int(seen or -1)


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
        port: int = 0,
        ports: int = 1,
        host_id: str = "",
        publisher: str = "",
    ):
        self.client, self.keys, self.layout = client, keys, layout
        self.bucket_bytes, self.timeout_s, self.host = bucket_bytes, timeout_s, host
        self.port, self.ports, self.host_id, self.publisher = port, ports, host_id, publisher
        self.backend = resolve_backend(backend)
        self.device = _device(self.backend)
        self.plan = windows(layout, bucket_bytes)
        self.sizes = bucket_sizes(layout, bucket_bytes)
        self.bucket = torch.empty(max(self.sizes, default=0), dtype=torch.uint8, device=self.device)
        self.epoch = int(client.get(keys.weights_dist_epoch) or 0)
        self.members: list[str] = []
        # member -> the epoch it was dropped from (invited again once it has seen that epoch)
        self.dropped: dict[str, int] = {}
        self.store: tdist.TCPStore | None = None
        self.group = None
        self.seq = 0
        self.broken = True

    def live_members(self) -> list[str]:
        """Members with a fresh heartbeat, less those dropped that have not noticed it yet."""
        now = time.time()
        raw = self.client.hgetall(self.keys.weights_dist_members)
        live, expired = [], []
        for member, beat in raw.items():
            member = as_str(member)
            expiry, seen = parse_beat(beat)
            if expiry <= now:
                expired.append(member)
            elif seen >= self.dropped.get(member, -1):
                self.dropped.pop(member, None)
                live.append(member)
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
            "host_id": self.host_id,
        }
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self.keys.weights_dist_group, json.dumps(record))
        pipe.set(self.keys.weights_dist_epoch, self.epoch)
        pipe.publish(self.keys.weights_notify, f"group {self.epoch}")
        pipe.execute()

    def _close_group(self) -> None:
        self.group = None
        self.members = []

    def reform(self, invited: list[str], deadline: float) -> None:
        """New epoch for ``invited``: the group is whoever checked in before ``deadline``."""
        self._close_group()
        if self.store is None:
            self.store = bound_store(self.host, self.timeout_s, self.port, self.ports)
        self.epoch += 1
        self.seq = 0
        self._announce_group(invited)
        joined = self._wait_ready(invited, deadline)
        missing = [m for m in invited if m not in joined]
        if missing:
            log.warning(
                "weightsync dist: %s did not join epoch %d within %.1fs; dropped",
                missing,
                self.epoch,
                self.timeout_s,
            )
            metrics.TRANSFER_FAILURES.labels(reason="peer_dropped").inc(len(missing))
            self.dropped.update(dict.fromkeys(missing, self.epoch))
        self.store.set(f"e{self.epoch}/final", json.dumps(joined))
        self.broken = False
        if not joined:
            return
        prefix = tdist.PrefixStore(f"e{self.epoch}/pg/", self.store)
        try:
            with bounded(f"forming epoch {self.epoch}'s group", self.timeout_s):
                self.group = make_group(
                    self.backend, prefix, 0, len(joined) + 1, self.timeout_s, self.host
                )
        # a member died between check-in and connect: retried at the next publish
        except Exception as exc:
            metrics.TRANSFER_FAILURES.labels(reason="rendezvous").inc()
            log.warning("weightsync dist: epoch %d failed to form: %s", self.epoch, exc)
            self.broken = True
            return
        self.members = joined

    def _wait_ready(self, invited: list[str], deadline: float) -> list[str]:
        keys = {m: f"e{self.epoch}/ready/{m}" for m in invited}
        while invited and time.monotonic() < deadline:
            if self.store.check(list(keys.values())):
                return list(invited)
            time.sleep(0.01)
        return [m for m in invited if self.store.check([keys[m]])]

    def send(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        aliases: dict[str, str],
        checksums: dict[str, int] | None = None,
        flat: torch.Tensor | None = None,
        sums: list[int] | None = None,
    ) -> dict:
        """Broadcast one version to the members; waits at most ``timeout_s`` for members to join and
        each bucket at most ``timeout_s``. A failed broadcast is retried once with a re-formed group
        while that budget lasts; members the version missed get the next one. ``flat``: the
        version already laid out as the layout's byte stream on this sender's device (a shm slot),
        broadcast from where it lies instead of bucket by bucket through a copy; ``sums``: its shm
        checksums (layout order), passed on in the header for members that keep it in shm."""
        deadline = time.monotonic() + self.timeout_s
        for attempt in range(2):
            invited = self.live_members()
            if self.broken or invited != self.members:
                self.reform(invited, deadline)
            if self.group is None:
                break
            try:
                self._broadcast(version, tensors, aliases, flat, sums)
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
                self._close_group()
            if time.monotonic() >= deadline:
                break
        return {"epoch": self.epoch, "members": []}

    def _broadcast(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        aliases: dict[str, str],
        flat: torch.Tensor | None = None,
        sums: list[int] | None = None,
    ) -> None:
        header = {
            "version": version,
            "layout": self.layout.to_json(),
            "aliases": aliases,
            "bucket_bytes": self.bucket_bytes,
            "publisher": self.publisher,
            "checksums": sums,
        }
        self.store.set(f"e{self.epoch}/pub/{self.seq}", json.dumps(header))
        # members read a header before its broadcast starts; two back is long taken
        if self.seq >= 2:
            self.store.delete_key(f"e{self.epoch}/pub/{self.seq - 2}")
        self.seq += 1
        timeout = dt.timedelta(seconds=self.timeout_s)
        if flat is not None:
            for index, size in enumerate(self.sizes):
                start = index * self.bucket_bytes
                with bounded(f"broadcast of version {version}", self.timeout_s):
                    bucket = flat[start : start + size]
                    self.group.broadcast([bucket], tdist.BroadcastOptions()).wait(timeout)
            return
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
        # its server stops with it: members of the last epoch see the store gone
        self.store = None


class DistReceiver:
    """Member side, driven by the subscriber's (or the relay's) loop through ``step``."""

    def __init__(self, client: redis.Redis, keys: Keys, actor_id: str, *, timeout_s: float):
        self.client, self.keys, self.actor_id = client, keys, actor_id
        self.timeout_s = timeout_s
        self.bucket = torch.empty(0, dtype=torch.uint8)
        self.epoch: int | None = None
        # the newest group record acted on (joined, left out of, or failed to join)
        self.seen = -1
        self.store = None
        self.group = None
        self.device = torch.device("cpu")
        self.seq = 0
        # the publisher id and shm checksums (None: not sent) of the version being received
        self.publisher = ""
        self.checksums: list[int] | None = None
        self._next_beat = 0.0

    def heartbeat(self, now: bool = False) -> None:
        t = time.time()
        if now or t >= self._next_beat:
            self.client.hset(
                self.keys.weights_dist_members, self.actor_id, f"{t + self.timeout_s} {self.seen}"
            )
            self._next_beat = t + self.timeout_s / 4

    def _leave(self) -> None:
        self.group = self.store = None
        self.epoch = None

    def _join_if_listed(self) -> None:
        raw = self.client.get(self.keys.weights_dist_group)
        if raw is None:
            return
        record = json.loads(raw)
        epoch = int(record["epoch"])
        # (not <=: a Redis that lost its data restarts the count)
        if epoch == self.seen:
            return
        self._leave()
        self.seen = epoch
        if self.actor_id not in record["members"]:
            # tells the publisher this member is alive and listening again (after being dropped)
            self.heartbeat(now=True)
            return
        timeout = dt.timedelta(seconds=self.timeout_s)
        with bounded(f"connecting to epoch {epoch}'s store", self.timeout_s):
            store = tdist.TCPStore(
                record["host"], int(record["port"]), is_master=False, timeout=timeout
            )
        store.set(f"e{epoch}/ready/{self.actor_id}", "1")
        # the publisher writes the final list within timeout_s of the record; a member that checked
        # in just in time waits a little longer than that
        store.set_timeout(dt.timedelta(seconds=2 * self.timeout_s))
        with bounded(f"waiting for epoch {epoch}'s members", 2 * self.timeout_s):
            final = json.loads(store.get(f"e{epoch}/final"))
        store.set_timeout(timeout)
        self.heartbeat(now=True)
        if self.actor_id not in final:
            return
        backend = record["backend"]
        self.device = _device(backend)
        publisher_host = record["host"]
        local = publisher_host if is_loopback(publisher_host) else toward(publisher_host)
        with bounded(f"forming epoch {epoch}'s group", self.timeout_s):
            self.group = make_group(
                backend,
                tdist.PrefixStore(f"e{epoch}/pg/", store),
                final.index(self.actor_id) + 1,
                len(final) + 1,
                self.timeout_s,
                local or publisher_host,
            )
        self.store, self.epoch, self.seq = store, epoch, 0

    def step(self, wait_s: float, acquire, release) -> int | None:
        """Join a new epoch if listed, then wait up to ``wait_s`` for the next publish and receive it.

        ``acquire(version, layout, aliases)`` returns destination tensors by
        published name, or one flat uint8 tensor to take the layout's byte stream as it is (a shm
        slot), or None to receive and drop (staging busy); ``release(version, ok)`` is called
        after. Returns the version received.
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
            self._leave()
            return None
        # timeout: nothing published yet
        except tdist.DistStoreError:
            return None
        header = json.loads(self.store.get(key))
        self.seq += 1
        self.publisher = header.get("publisher", "")
        self.checksums = header.get("checksums")
        layout = Layout.from_json(header["layout"])
        version = int(header["version"])
        dest = acquire(version, layout, header["aliases"])
        ok = False
        try:
            self._receive(layout, int(header["bucket_bytes"]), dest)
            ok = dest is not None
        except Exception:
            self._leave()
            raise
        finally:
            release(version, ok)
        return version if ok else None

    def _receive(
        self,
        layout: Layout,
        bucket_bytes: int,
        dest: dict[str, torch.Tensor] | torch.Tensor | None,
    ) -> None:
        sizes = bucket_sizes(layout, bucket_bytes)
        if self.bucket.device != self.device or self.bucket.numel() < max(sizes, default=0):
            self.bucket = torch.empty(max(sizes, default=0), dtype=torch.uint8, device=self.device)
        bucket = self.bucket
        timeout = dt.timedelta(seconds=self.timeout_s)
        flat = dest if isinstance(dest, torch.Tensor) else None
        targets = (
            {name: _bytes_of(t) for name, t in dest.items()} if isinstance(dest, dict) else None
        )
        for index, (size, window) in enumerate(
            zip(sizes, windows(layout, bucket_bytes), strict=True)
        ):
            into = (
                None if flat is None else flat[index * bucket_bytes : index * bucket_bytes + size]
            )
            # straight into the flat destination when it lies on the group's device
            chunk = into if into is not None and into.device == self.device else bucket[:size]
            with bounded(f"epoch {self.epoch} broadcast", self.timeout_s):
                self.group.broadcast([chunk], tdist.BroadcastOptions()).wait(timeout)
            if into is not None and chunk is not into:
                into.copy_(chunk)
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
