"""Admission of new groups: a lease from the broker's admission control, then the next prompt.

A group may start only while the engine's weights are at most ``max_staleness`` versions behind
the learner (under ``auto``, the bound the learner set last, read by every request) and admission
control (``broker.admission``) grants a lease for the version that will generate it. ``wait`` is where the engine is idle, so it first runs what must happen between
batches (``idle``: an evaluation) and swaps in staged weights while it waits; ``now`` asks once, for a source
that keeps its engine busy (a refill) or answers a caller (an agent). Every lease granted is
held here until its group is published or released, renewed by the heartbeat and released on
shutdown.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

from streamrl.actors import metrics
from streamrl.actors.engines.base import Engine
from streamrl.actors.group import Group
from streamrl.actors.prompt_data import PromptCursor
from streamrl.broker.admission import Admission
from streamrl.broker.semantics import is_stale

POLL_S = 0.05


class Admit:
    def __init__(
        self,
        admission: Admission,
        prompts: PromptCursor,
        engine: Engine,
        actor_id: str,
        stop: threading.Event,
        idle: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.admission = admission
        self.prompts = prompts
        self.engine = engine
        self.actor_id = actor_id
        self.stop = stop
        self.idle = idle
        # leases of the groups in flight
        self.leases: set[str] = set()

    def stopping(self) -> bool:
        return self.stop.is_set()

    async def wait(self) -> Group | None:
        """The next group once admission grants it (None: stopping). The engine is idle meanwhile."""
        if self.idle is not None:
            await self.idle()
        started = time.monotonic()
        try:
            while not self.stop.is_set():
                self.engine.maybe_swap_weights()
                learner_version = await self.lag()
                group = await self._try(learner_version)
                if group is not None:
                    return group
                await asyncio.sleep(POLL_S)
            return None
        finally:
            metrics.ADMISSION_WAIT_SECONDS.inc(time.monotonic() - started)

    async def now(self) -> Group | None:
        """One more group if admission grants it at once, and the engine is fresh enough."""
        if self.stop.is_set():
            return None
        return await self._try(await self.admission.version())

    async def upto(self, count: int, wait: bool = True) -> list[Group]:
        """Up to ``count`` groups as admission grants them at once, after waiting for the first
        (``wait=False``: none if it is refused now)."""
        first = await (self.wait() if wait else self.now())
        if first is None:
            return []
        batch = [first]
        while len(batch) < count and (more := await self.now()) is not None:
            batch.append(more)
        return batch

    async def lag(self) -> int:
        """The learner's version, noting how far the engine is behind it."""
        learner_version = await self.admission.version()
        metrics.VERSION_LAG.set(max(0, learner_version - self.engine.version))
        return learner_version

    async def _try(self, learner_version: int) -> Group | None:
        # the bound depends on the version of the engine that will generate the group; the one in
        # force (under auto the learner's latest) is the script's, this only spares it a call
        if is_stale(learner_version, self.engine.version, self.admission.bounds.ceiling):
            return None
        lease = await self.admission.try_start(self.actor_id, self.engine.version)
        if lease is None:
            return None
        # at once: a stop from here on must release it
        self.leases.add(lease)
        return Group(lease, await self.prompts.next())

    async def release(self, lease_id: str) -> None:
        """Give up a group that will not be published."""
        await self.admission.release(lease_id)
        self.leases.discard(lease_id)

    def published(self, lease_id: str) -> None:
        """The producer took this lease with its group (``RolloutProducer.publish``)."""
        self.leases.discard(lease_id)

    async def renew(self) -> None:
        for lease_id in list(self.leases):
            await self.admission.renew(lease_id)

    async def release_all(self) -> None:
        for lease_id in list(self.leases):
            await self.release(lease_id)
