"""``streamrl sft``: supervised fine-tuning, the token mean of the trained tokens' negative
log-likelihood (``supervised_loss.sft_loss``) over each step's examples."""

from __future__ import annotations

from streamrl.learner import supervised_data as data
from streamrl.learner import supervised_loss as losses
from streamrl.learner.batching import MicroBatch, Sample
from streamrl.learner.supervised import Supervised
from streamrl.learner.supervised_batches import trained_tokens


class SFT(Supervised):
    """Examples of a chat's assistant turns or of a prompt's completion (``supervised_data``)."""

    name = "sft"

    @staticmethod
    def load(path: str, tokenizer, max_length: int) -> list[Sample]:
        return data.load_sft(path, tokenizer, max_length)

    def step(self, picked: list[Sample]) -> dict[str, float]:
        # the step's trained tokens over every rank: the loss is their mean
        normalizer = float(max(trained_tokens(picked), 1))
        batches, real = self.micro_batches(picked)

        def loss_of(logprobs, mb: MicroBatch, _real: bool):
            loss = losses.sft_loss(logprobs, mb.completion_mask, normalizer)
            return loss, {"tokens": mb.num_tokens}

        return self._micro_steps(batches, real, loss_of)
