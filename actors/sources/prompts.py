"""Source ``prompts``: dataset prompts, G completions each (the single-turn default).

The engine completes a batch of groups at once; each group is yielded as soon as its G
completions are done, while the rest of the batch decodes on. With ``actor.refill`` a freed slot
takes the next admitted group, so no slot waits for the longest completion of a batch
(completions of very different lengths); without it the next batch starts once this one ended.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

from streamrl.actors.admit import Admit
from streamrl.actors.engines.base import Output, Request
from streamrl.actors.group import Group, Sample
from streamrl.actors.sources.base import Generation, Source
from streamrl.configs.schema import ActorConfig


class PromptsSource(Source):
    name = "prompts"

    def __init__(self, gen: Generation, batch_slots: int, refill: bool) -> None:
        self.gen = gen
        self.batch_slots = batch_slots
        self.refill = refill

    @classmethod
    def from_config(cls, gen: Generation, *, actor: ActorConfig) -> PromptsSource:
        return cls(gen, actor.batch_slots, actor.refill)

    async def groups(self, admit: Admit) -> AsyncIterator[Group]:
        per_batch = max(1, self.batch_slots // self.gen.group_size)
        while not admit.stopping():
            batch = await admit.upto(per_batch)
            if batch:
                async for group in self._roll_out(batch, admit):
                    yield group

    def _requests(self, g: int, group: Group) -> list[Request]:
        return [Request(f"{g}:{j}", group.prompt.token_ids) for j in range(self.gen.group_size)]

    async def _roll_out(self, batch: list[Group], admit: Admit) -> AsyncIterator[Group]:
        """Generate ``batch`` (growing with refills) and yield each group as it completes."""
        loop = asyncio.get_running_loop()
        size = self.gen.group_size
        # indices of the groups whose G outputs are all in, in the order they completed
        completed: asyncio.Queue[int] = asyncio.Queue()
        finished: dict[int, dict[int, Output]] = {}
        # set when the caller stops iterating: the engine aborts what it still decodes
        abandoned = threading.Event()

        def on_finished(index: int, output: Output) -> None:
            g, j = divmod(index, size)
            outputs = finished.setdefault(g, {})
            outputs[j] = output
            if len(outputs) == size:
                loop.call_soon_threadsafe(completed.put_nowait, g)

        def refill(room: int) -> list[Request]:
            # whole groups only, as many as fill the room, in one hop to the event loop (Redis
            # round trips while the engine waits): a group's rows are prefilled together, and
            # a prefill of several groups costs about one of one
            if room < min(size, self.batch_slots):
                return []
            wanted = max(1, room // size)
            more = asyncio.run_coroutine_threadsafe(admit.upto(wanted, wait=False), loop).result()
            requests = []
            for group in more:
                batch.append(group)
                requests += self._requests(len(batch) - 1, group)
            return requests

        requests = [r for g, group in enumerate(batch) for r in self._requests(g, group)]
        started = time.monotonic()
        generation = asyncio.ensure_future(
            asyncio.to_thread(
                self.gen.engine.generate,
                requests,
                self.gen.params,
                lambda: admit.stopping() or abandoned.is_set(),
                refill if self.refill else None,
                on_finished,
            )
        )
        yielded: set[int] = set()
        try:
            while not generation.done():
                take = asyncio.ensure_future(completed.get())
                await asyncio.wait({generation, take}, return_when=asyncio.FIRST_COMPLETED)
                if not take.done():
                    take.cancel()
                    break
                g = take.result()
                yielded.add(g)
                yield self._rolled_out(batch[g], [finished[g][j] for j in range(size)])
            outputs = await generation
        finally:
            abandoned.set()
            if not generation.done():
                await asyncio.gather(generation, return_exceptions=True)
        self.gen.generated(sum(len(o.token_ids) for o in outputs), started)
        for g, group in enumerate(batch):
            if g in yielded:
                continue
            mine = outputs[g * size : (g + 1) * size]
            if all(o.finish_reason != "abort" for o in mine):
                yield self._rolled_out(group, mine)
            else:
                await admit.release(group.lease_id)

    def _rolled_out(self, group: Group, outputs: list[Output]) -> Group:
        group.samples = [Sample(o, self.gen.reward_input(group.prompt, o)) for o in outputs]
        return group
