"""Test-side rollouts for the learner tests: a plain sampling loop on the demo task, and a stream writer.

Deliberately independent of ``actors``' engines: full forward passes, no KV
cache, so the learner is checked against the simplest possible producer.
"""

from __future__ import annotations

import random
import uuid

import numpy as np
import redis
import torch
import torch.nn.functional as F

from streamrl.broker.keys import Keys
from streamrl.broker.wire import Completion, RolloutGroup, encode_group
from streamrl.examples.reverse_digits.rewards import reverse_digits_reward
from streamrl.examples.reverse_digits.task import EOS, make_example

# the demo's shaped reward under its preset's name, so its parts read reverse_digits/... as the
# rollouts below name them
DEMO_REWARD = {"fn": "streamrl.examples.reverse_digits:reverse_digits", "name": "reverse_digits"}


@torch.no_grad()
def sample_groups(
    model,
    tokenizer,
    rng: random.Random,
    groups: int,
    group_size: int,
    version: int,
    max_new_tokens: int = 8,
) -> list[RolloutGroup]:
    """``groups`` demo prompts x ``group_size`` completions at temperature 1, tagged with ``version``."""
    model.eval()
    examples = [make_example(rng) for _ in range(groups)]
    prompts = [tokenizer(ex["prompt"])["input_ids"] for ex in examples]
    # demo prompts share one length
    ids = torch.tensor([p for p in prompts for _ in range(group_size)])
    gen = torch.Generator().manual_seed(rng.randrange(1 << 31))
    prompt_len, eos = ids.shape[1], tokenizer.eos_token_id
    logprobs = []
    done = torch.zeros(ids.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        dist = F.log_softmax(model(input_ids=ids).logits[:, -1].float(), dim=-1)
        token = torch.multinomial(dist.exp(), 1, generator=gen).squeeze(-1)
        logprobs.append(dist.gather(-1, token[:, None]).squeeze(-1))
        ids = torch.cat([ids, token[:, None]], dim=1)
        done |= token == eos
        if bool(done.all()):
            break
    logprobs = torch.stack(logprobs, dim=1)
    out = []
    for g, ex in enumerate(examples):
        completions = []
        for row in range(g * group_size, (g + 1) * group_size):
            tokens = ids[row, prompt_len:].tolist()
            length = tokens.index(eos) + 1 if eos in tokens else len(tokens)
            tokens = tokens[:length]
            stopped = tokens[-1] == eos
            text = tokenizer.decode(tokens[:-1] if stopped else tokens, skip_special_tokens=True)
            parts = reverse_digits_reward(text + (EOS if stopped else ""), ex["answer"])
            completions.append(
                Completion(
                    token_ids=np.array(tokens, dtype=np.int32),
                    logprobs=logprobs[row, :length].numpy().astype(np.float32),
                    versions=np.full(length, version, dtype=np.int32),
                    reward=sum(parts.values()),
                    finish_reason="stop" if stopped else "length",
                    # named as an actor names them: after the reward function (actors.rewards)
                    reward_parts={f"reverse_digits/{k}": v for k, v in parts.items()},
                )
            )
        out.append(
            RolloutGroup(
                group_id=uuid.uuid4().hex,
                prompt_id=ex["prompt"],
                actor_id="test",
                seq=g,
                prompt_token_ids=np.array(prompts[g], dtype=np.int32),
                completions=completions,
            )
        )
    return out


def xadd_groups(cfg, groups: list[RolloutGroup]) -> None:
    """Append groups to the run's stream the way an actor does (payload in field ``g``, accepted counted)."""
    client = redis.Redis.from_url(cfg.broker.redis_url)
    keys = Keys.from_config(cfg.run, cfg.broker)
    try:
        for group in groups:
            client.xadd(keys.stream, {"g": encode_group(group)})
            client.incr(keys.accepted)
    finally:
        client.close()
