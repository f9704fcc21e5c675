"""Publishing a scored group: one stream entry (``broker.wire.RolloutGroup``), its lease handed over.

The producer takes the group's admission lease in the same script that counts the group accepted
(``broker.stream.RolloutProducer``). Groups are numbered per actor (``seq``) and their ids are
unique (actor, sequence number and a random suffix), so a redelivered entry is recognised.
"""

from __future__ import annotations

import logging
import time
import uuid

import numpy as np

from streamrl.actors import metrics
from streamrl.actors.group import Group
from streamrl.actors.rewards import Score, failure_meta
from streamrl.broker.stream import RolloutProducer
from streamrl.broker.wire import Completion, RolloutGroup
from streamrl.runtime.jsonl_log import JsonlLog

log = logging.getLogger(__name__)


def build_group(actor_id: str, seq: int, group: Group, scores: list[Score]) -> RolloutGroup:
    refs = group.ref_logprobs or [None] * len(group.samples)
    completions = [
        Completion(
            o.token_ids,
            o.logprobs,
            o.versions,
            s.total,
            o.finish_reason,
            s.parts,
            ref,
            o.meta.get("loss_mask"),
        )
        for o, s, ref in zip(group.outputs, scores, refs, strict=True)
    ]
    return RolloutGroup(
        group_id=f"{actor_id}-{seq}-{uuid.uuid4().hex[:8]}",
        prompt_id=group.prompt.prompt_id,
        actor_id=actor_id,
        seq=seq,
        prompt_token_ids=np.asarray(group.prompt_token_ids, dtype=np.int32),
        completions=completions,
        created_at=time.time(),
        meta={"epoch": group.prompt.epoch, "row": group.prompt.index, **failure_meta(scores)},
        env=group.env,
    )


class Outbox:
    def __init__(
        self, producer: RolloutProducer, actor_id: str, publish_log: JsonlLog | None = None
    ) -> None:
        self.producer = producer
        self.actor_id = actor_id
        # <run.dir>/published/<actor id>.jsonl (``actor.publish_log``)
        self.publish_log = publish_log
        # groups published so far: the next group's sequence number
        self.seq = 0

    async def publish(self, group: Group, scores: list[Score]) -> None:
        entry = build_group(self.actor_id, self.seq, group, scores)
        entry_id = await self.producer.publish(entry, group.lease_id)
        if self.publish_log is not None:
            self.publish_log.write({"group_id": entry.group_id, "entry_id": entry_id})
        self.seq += 1
        _observe(entry)
        if self.seq == 1:
            log.info("actor %s: first group published", self.actor_id)

    def close(self) -> None:
        if self.publish_log is not None:
            self.publish_log.close()


def _observe(group: RolloutGroup) -> None:
    metrics.GROUPS_PUBLISHED.inc()
    metrics.TOKENS_PUBLISHED.inc(sum(len(c) for c in group.completions))
    parts: dict[str, list[float]] = {}
    for c in group.completions:
        metrics.COMPLETION_LENGTH.observe(len(c))
        metrics.REWARD.observe(c.reward)
        for name, value in c.reward_parts.items():
            parts.setdefault(name, []).append(value)
    for name, values in parts.items():
        metrics.REWARD_PART.labels(part=name).set(float(np.mean(values)))
