"""``streamrl dpo``: preference pairs, DPO's sigmoid loss or IPO's (``supervised_loss``).

Each pair's chosen and rejected responses share a micro-batch (rows 2i and 2i + 1,
``supervised_batches.pair_micro_batches``): the loss needs both sums. The reference is
``policy.lora.reference_policy``, the KL reference of RL: the starting weights, or the same model
with its adapters off.
"""

from __future__ import annotations

import torch

from streamrl.learner import supervised_batches as sb
from streamrl.learner import supervised_data as data
from streamrl.learner import supervised_loss as losses
from streamrl.learner.batching import MicroBatch, Sample
from streamrl.learner.engine import token_logprobs
from streamrl.learner.supervised import Supervised


class DPO(Supervised):
    """Pairs of a chosen and a rejected response (``supervised_data.pair_samples``)."""

    name = "dpo"
    reference = True

    @staticmethod
    def load(path: str, tokenizer, max_length: int) -> list[sb.Pair]:
        return data.load_pairs(path, tokenizer, max_length)

    def samples_of(self, picked: list[sb.Pair]) -> list[Sample]:
        return [s for pair in picked for s in pair]

    def step(self, picked: list[sb.Pair]) -> dict[str, float]:
        sc = self.sc
        batches, real = self.micro_batches(picked, sb.pair_micro_batches)
        with torch.no_grad():
            refs = [token_logprobs(self.ref_model, mb, 1.0) for mb in batches]
        refs_iter = iter(refs)

        def loss_of(logprobs, mb: MicroBatch, is_real: bool):
            ref = next(refs_iter)
            mask = mb.completion_mask
            policy, reference = losses.row_sums(logprobs, mask), losses.row_sums(ref, mask)
            counts = mask.sum(-1).to(policy.dtype)
            margin = losses.dpo_margin(
                policy[0::2],
                policy[1::2],
                reference[0::2],
                reference[1::2],
                sc.loss,
                counts[0::2],
                counts[1::2],
            )
            if not is_real:
                # a filler keeps the collective backward but trains nothing
                return 0.0 * logprobs.sum(), {"tokens": 0}
            loss = losses.dpo_losses(margin, sc.beta, sc.loss).sum() / len(picked)
            chosen = losses.implicit_rewards(policy[0::2], reference[0::2], sc.beta)
            rejected = losses.implicit_rewards(policy[1::2], reference[1::2], sc.beta)
            return loss, {
                "tokens": mb.num_tokens,
                "pairs": len(chosen),
                "chosen_reward": float(chosen.sum()),
                "rejected_reward": float(rejected.sum()),
                "accurate": float((chosen > rejected).sum()),
            }

        return self._micro_steps(batches, real, loss_of)

    def figures(self, sums: dict[str, float]) -> dict[str, float]:
        """The implicit rewards (``beta x`` the log-ratio to the reference) per pair."""
        pairs = max(sums["pairs"], 1.0)
        return {
            "chosen_reward": sums["chosen_reward"] / pairs,
            "rejected_reward": sums["rejected_reward"] / pairs,
            "reward_margin": (sums["chosen_reward"] - sums["rejected_reward"]) / pairs,
            "reward_accuracy": sums["accurate"] / pairs,
        }

    def describe_figures(self, row: dict) -> str:
        return f" margin {row['reward_margin']:+.3f} accuracy {row['reward_accuracy']:.2f}"
