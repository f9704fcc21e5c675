"""The frozen initial policy on an actor (``algo.reference_on: actors``).

It scores each completion's tokens right after generation, and the log-probs travel with the
group (``broker.wire``'s ``rlp`` column), so the learner's step has no reference pass. The
learner is what actors wait for (they generate one batch ahead, then wait for admission),
so the pass costs the actor time it would otherwise spend waiting. The log-probs are those
the learner's pass would give: the same function (``policy.logprobs.sequence_logprobs``)
on the same folder under the same sampling distribution (temperature, top-k, top-p; the KL is
the one between the truncated distributions the run samples from, docs/guarantees.md "What mu is").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from streamrl.policy.load import load_policy
from streamrl.policy.logprobs import Sampling, sequence_logprobs


class ReferenceScorer:
    def __init__(
        self, path: str, dtype: str, device: str, sampling: Sampling | float, token_budget: int
    ) -> None:
        """The policy of ``path`` (``model.path``, ``model.dtype``) on ``device``;
        ``sampling``: the run's (``rollout.temperature``, ``top_k``, ``top_p``); ``token_budget``:
        rows x padded length per forward pass, as the learner's micro-batches
        (``learner.micro_batch_tokens``): the logits ([rows, length, vocabulary] floats) are
        what grows."""
        self.model = load_policy(path, dtype, device)
        self.model.requires_grad_(False)
        self.sampling = sampling
        self.token_budget = token_budget

    @torch.no_grad()
    def logprobs(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Per completion, the reference log-prob of each of its tokens (float32, [len])."""
        rows = [(list(p), list(c)) for p, c in zip(prompts, completions, strict=True)]
        out: list[np.ndarray] = []
        start = 0
        while start < len(rows):
            end, longest = start, 0
            while end < len(rows):
                width = max(longest, sum(map(len, rows[end])))
                if end > start and width * (end - start + 1) > self.token_budget:
                    break
                longest, end = width, end + 1
            out += self._chunk(rows[start:end], longest)
            start = end
        return out

    def _chunk(self, rows: list[tuple[list[int], list[int]]], width: int) -> list[np.ndarray]:
        input_ids = torch.zeros((len(rows), width), dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (prompt, completion) in enumerate(rows):
            sequence = prompt + completion
            input_ids[i, : len(sequence)] = torch.tensor(sequence)
            attention_mask[i, : len(sequence)] = 1
        scores = sequence_logprobs(self.model, input_ids, attention_mask, self.sampling)
        scores = scores.float().cpu().numpy()
        # completion token k sits at input position p + k, so its score is at position p + k - 1
        return [scores[i, len(p) - 1 : len(p) - 1 + len(c)].copy() for i, (p, c) in enumerate(rows)]
