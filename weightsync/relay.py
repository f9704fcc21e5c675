"""The host relay, ``python -m streamrl.weightsync.relay --config X [--host-id H] [key=value ...]``:
one per actor host when weights travel over ``dist`` with ``weightsync.dist.relay`` on (``wanted``).

It joins the learner's dist group as its host's single member (``relay:<run.host_id>``), takes
each version once and writes it into a shared-memory segment of its own, announced under its
host's keys (``weightsync.hosts``). The host's actors read that segment as actors on one host read
the learner's (their feed picks it from ``run.host_id``, ``weightsync.feed``): one copy per host
per version crosses the network however many actors the host runs, and an actor that starts late
or restarts takes the newest version from the segment at once. On the learner's own host the
learner writes that host's segment itself, and a relay started there stays out of the group.

What it received is counted in ``streamrl_weights_relay_bytes``/``..._relay_versions`` and in the
run's ``weights:relay:received`` hash (``<host_id>:bytes``, ``<host_id>:versions``; what it
refused, ``<host_id>:refused``: headers the learner did not sign, ``weightsync.transports.dist.trust``;
and its failed steps, ``<host_id>:errors``, also in ``streamrl_weights_transfer_failures{reason="relay"}``).
Versions, layouts and checksums come only from what the learner signed; no bytes a peer sends
end its loop: a step that fails is counted and the next version is served. A lost
learner, broker or link is waited out (the learner drops the relay after ``weightsync.timeout_s``
and takes it back when it returns); it exits 0 on SIGTERM or SIGINT, 1 when it cannot start, 2
when the config asks for no relay.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time

import redis
import torch

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.configs import ConfigError, config_from_cli
from streamrl.configs.schema import WeightSyncConfig
from streamrl.runtime import metrics_endpoint as endpoint_metrics
from streamrl.weightsync import metrics, transports
from streamrl.weightsync.announce import announce, read_announcement
from streamrl.weightsync.hosts import host_keys, relay_member, relay_stats_key
from streamrl.weightsync.layout import Layout
from streamrl.weightsync.transports.dist import host_segment
from streamrl.weightsync.transports.dist.receiver import DistReceiver
from streamrl.weightsync.transports.dist.trust import Refused, group_record
from streamrl.weightsync.transports.shm.segment import unlink_on_stop
from streamrl.weightsync.transports.shm.slots import ShmWriter

log = logging.getLogger(__name__)

# how long one step waits for the next broadcast before it looks at the group again
STEP_WAIT_S = 0.2
# back-off after an error (Redis or the learner unreachable) before trying again
RETRY_S = 1.0


def wanted(ws: WeightSyncConfig) -> bool:
    """Whether an actor host runs a relay for this config (its actors then read the relay's shm):
    the transport's ``relayed``."""
    return transports.get(ws.transport).relayed(ws)


class Relay:
    """The learner's dist group on one side, the host's shm segment and announcements on the other."""

    def __init__(self, ws: WeightSyncConfig, keys: Keys, client: redis.Redis, host_id: str):
        self.ws, self.keys, self.client, self.host_id = ws, keys, client, host_id
        self.local = host_keys(keys, host_id)
        self.receiver = DistReceiver(client, keys, relay_member(host_id), timeout_s=ws.timeout_s)
        self.writer: ShmWriter | None = None
        self.layout: Layout | None = None
        self.slot = -1
        self.aliases: dict[str, str] = {}
        # (publisher, version) served last: a catch-up resend of it is received and dropped
        self.served: tuple[str, int] | None = None
        self._refused = 0
        self._forget_predecessor()

    def _forget_predecessor(self) -> None:
        """Withdraw the announcement a previous relay of this host left: its segment went with it,
        and an actor that found it gone would skip that version for good, the one this relay is
        about to be caught up with (the learner's, on the learner's host, is left alone)."""
        try:
            ann = read_announcement(self.client, self.local)
        except ValueError:
            ann = None
        if ann is not None and ann.meta.get("relay") == self.host_id:
            self.client.delete(self.local.weights)

    def learner_here(self) -> bool:
        """Whether the learner publishing now runs on this host (it serves the host's shm itself)."""
        raw = self.client.get(self.keys.weights_dist_group)
        try:
            return raw is not None and group_record(raw).host_id == self.host_id
        # the receiver counts it, and joins no group from it
        except Refused:
            return False

    def step(self, wait_s: float = STEP_WAIT_S) -> int | None:
        """Receive and serve the next version if one comes within ``wait_s``; returns it. A
        failure is counted (``<host_id>:errors``) and raised for the caller to back off."""
        try:
            if self.learner_here():
                self.receiver.close()
                time.sleep(wait_s)
                return None
            return self.receiver.step(wait_s, self._acquire, self._release)
        except Exception:
            metrics.TRANSFER_FAILURES.labels(reason="relay").inc()
            self._count("errors", 1)
            raise
        finally:
            if self.receiver.refused != self._refused:
                self._count("refused", self.receiver.refused - self._refused)
                self._refused = self.receiver.refused

    def _count(self, what: str, n: int) -> None:
        try:
            self.client.hincrby(relay_stats_key(self.keys), f"{self.host_id}:{what}", n)
        # Redis away: the Prometheus counters still have it
        except redis.RedisError:
            pass

    def _acquire(
        self, version: int, layout: Layout, aliases: dict[str, str]
    ) -> torch.Tensor | None:
        """The broadcast lands straight in a free slot of this host's segment (dropped if it is
        the version served last: the learner caught another relay up)."""
        if self.served == (self.receiver.publisher, version):
            return None
        if layout != self.layout:
            if self.writer is not None:
                self.writer.close()
            self.writer = host_segment(self.ws, self.keys, layout, self.host_id)
            self.layout = layout
        self.aliases = aliases
        self.slot, flat = self.writer.begin(version)
        return flat

    def _release(self, version: int, ok: bool) -> None:
        # a slot left unfinished keeps its begin stamp alone: no reader takes it
        if not ok:
            return
        self.served = (self.receiver.publisher, version)
        # the learner's checksums: the host's actors check what crossed the network end to end
        self.writer.commit(self.slot, version, self.receiver.checksums)
        self.receiver.marks["committed"] = time.time()
        meta = {
            "layout": self.layout.to_json(),
            "aliases": self.aliases,
            "segment": self.writer.name,
            "slot": self.slot,
            "relay": self.host_id,
        }
        pipe = self.client.pipeline(transaction=False)
        pipe.hincrby(relay_stats_key(self.keys), f"{self.host_id}:bytes", self.layout.total_bytes)
        pipe.hincrby(relay_stats_key(self.keys), f"{self.host_id}:versions", 1)
        pipe.execute()
        announce(self.client, self.local, version, "shm", self.receiver.publisher, meta)
        self.receiver.marks["announced"] = time.time()
        metrics.RELAY_BYTES.inc(self.layout.total_bytes)
        metrics.RELAY_VERSIONS.inc()
        metrics.PUBLISHED_VERSION.set(version)

    def close(self) -> None:
        self.receiver.close()
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streamrl.weightsync.relay", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host-id", help="this host's run.host_id (default: the config's)")
    try:
        args, cfg = config_from_cli(parser, argv)
        if args.host_id:
            cfg.run.host_id = args.host_id
    except (ConfigError, ValueError) as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s relay %(levelname)s %(message)s")
    if not wanted(cfg.weightsync):
        print(
            f"relay: weightsync.transport={cfg.weightsync.transport} needs no relay "
            "(relays are the dist transport's: weightsync.dist.relay)",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(cfg.run.torch_threads)
    stop = threading.Event()

    def request_stop(*_) -> None:
        stop.set()
        # a kill before the relay closes (Slurm's, a supervisor's) must not leave the segment
        unlink_on_stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, request_stop)
    host_id = cfg.run.host_id
    try:
        client = connect_sync(cfg.broker, cfg.run.dir)
        endpoint = endpoint_metrics.Endpoint.from_config(cfg.metrics, cfg.broker, cfg.run)
        port = endpoint_metrics.serve(endpoint, "relay", host_id)
    except (OSError, redis.RedisError) as exc:
        print(f"relay {host_id}: cannot start: {exc}", file=sys.stderr)
        return 1
    relay = Relay(cfg.weightsync, Keys.from_config(cfg.run, cfg.broker), client, host_id)
    print(f"relay {host_id} up (member {relay_member(host_id)})", flush=True)
    try:
        while not stop.is_set():
            try:
                version = relay.step()
            # the learner, its store or the broker out of reach, or a peer's bytes it refused: wait
            # it out (counted by step), the learner takes us back
            except Exception as exc:
                log.warning("relay %s: %s", host_id, str(exc).splitlines()[0][:300])
                stop.wait(RETRY_S)
                continue
            if version is not None:
                marks = relay.receiver.marks
                log.info(
                    "relay %s: version %d served %.1f ms after its header (received at %.1f ms)",
                    host_id,
                    version,
                    (marks["announced"] - marks["header"]) * 1e3,
                    (marks["received"] - marks["header"]) * 1e3,
                )
    finally:
        relay.close()
        try:
            endpoint_metrics.unregister(endpoint, "relay", host_id, port)
        except redis.RedisError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
