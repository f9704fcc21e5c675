"""SFT on the learner: the tokens a row trains, and the loss and gradients of the packed path.

The assistant masks are checked against transformers' own ``return_assistant_tokens_mask``
(a template with ``{% generation %}`` markers around the assistant turns), and the loss and
every gradient of the learner's packed rows against a plain torch loss on right-padded rows
(transformers' ``labels`` loss), in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrl.examples.reverse_digits.task import build_model, build_tokenizer
from streamrl.learner import supervised_batches as sb
from streamrl.learner import supervised_data as data
from streamrl.learner.batching import collate, rank_micro_batches
from streamrl.learner.engine import token_logprobs
from streamrl.learner.supervised_loss import sft_loss

# the demo template with transformers' generation markers around what an assistant turn adds
MARKED_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>\n{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATS = [
    [
        {"role": "system", "content": "reverse"},
        {"role": "user", "content": "314>"},
        {"role": "assistant", "content": "413"},
        {"role": "user", "content": "no: 27>"},
        {"role": "assistant", "content": "72"},
    ],
    [{"role": "user", "content": "9>"}, {"role": "assistant", "content": "9"}],
    [
        {"role": "user", "content": "12>"},
        {"role": "assistant", "content": "21"},
        {"role": "user", "content": "again"},
    ],
]
ROWS = [
    *({"messages": chat} for chat in CHATS),
    {"prompt": "5678>", "completion": "8765"},
    {"prompt": [{"role": "user", "content": "40>"}], "completion": "04"},
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_chat_masks_are_transformers_assistant_masks(tokenizer):
    for chat in CHATS:
        ids, mask = data.chat_tokens(tokenizer, chat)
        expected = tokenizer.apply_chat_template(
            chat,
            chat_template=MARKED_TEMPLATE,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        assert ids == list(expected["input_ids"])
        assert mask == [bool(m) for m in expected["assistant_masks"]]
        assert any(mask) and not all(mask)


def test_a_completion_trains_itself_and_the_end_token_only(tokenizer):
    sample = data.sft_sample(tokenizer, {"prompt": "31>", "completion": "13"}, 64, "row")
    assert tokenizer.decode(sample.input_ids[: sample.prompt_len]) == "31>"
    assert tokenizer.decode(sample.input_ids[sample.prompt_len :]) == "13" + tokenizer.eos_token
    assert sample.trained().all()
    cut = data.sft_sample(tokenizer, {"prompt": "31>", "completion": "13"}, 4, "row")
    assert len(cut) == 4 and cut.trained().sum() == 1


def test_a_row_that_trains_nothing_is_refused_naming_it(tokenizer):
    with pytest.raises(ValueError, match="data.jsonl:3"):
        data.sft_sample(tokenizer, {"prompt": "31>", "completion": "13"}, 3, "data.jsonl:3")
    with pytest.raises(ValueError, match="messages"):
        data.sft_sample(tokenizer, {"body": "31>13"}, 64, "row")


def test_trls_text_rows_train_every_token_after_the_first_and_the_end_token(tokenizer):
    sample = data.sft_sample(tokenizer, {"text": "31>13"}, 64, "row")
    assert tokenizer.decode(sample.input_ids) == "31>13" + tokenizer.eos_token
    # nothing before the first token predicts it
    assert sample.prompt_len == 1 and sample.trained().all()


def _reference(model, samples, pad_id: int) -> torch.Tensor:
    """The labels loss on right-padded rows: the token mean over the trained tokens."""
    width = max(len(s) for s in samples)
    ids = torch.full((len(samples), width), pad_id)
    attention = torch.zeros(len(samples), width, dtype=torch.long)
    labels = torch.full((len(samples), width), -100)
    for i, s in enumerate(samples):
        n = len(s)
        ids[i, :n] = torch.from_numpy(s.input_ids)
        attention[i, :n] = 1
        trained = np.zeros(n, dtype=bool)
        trained[s.prompt_len :] = s.trained()
        labels[i, :n] = torch.where(torch.from_numpy(trained), ids[i, :n], -100)
    # transformers' own loss would upcast the logits to float32: the same sum, by hand, in float64
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
    targets = labels[:, 1:]
    counted = targets != -100
    logprobs = torch.log_softmax(logits, -1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return -(logprobs * counted).sum() / counted.sum()


def test_packed_sft_loss_and_gradients_equal_the_padded_torch_loss_in_float64(tokenizer):
    model = build_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, seed=3)
    model = model.double()
    model.config._attn_implementation = "sdpa"
    samples = [data.sft_sample(tokenizer, row, 64, f"r{i}") for i, row in enumerate(ROWS)]
    pad = tokenizer.pad_token_id
    reference = _reference(model, samples, pad)
    reference.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    # a budget of two packed rows of 64: several samples share a row, and two micro-batches
    budget = 128
    batches, real = rank_micro_batches(samples, 1, 0, budget, pad, torch.device("cpu"))
    assert real == len(batches) >= 2
    assert any(mb.packed_ids.shape[0] < mb.input_ids.shape[0] for mb in batches)
    normalizer = float(sb.trained_tokens(samples))
    ours = 0.0
    for mb in batches:
        loss = sft_loss(token_logprobs(model, mb, 1.0), mb.completion_mask, normalizer)
        loss.backward()
        ours += loss.item()
    assert ours == pytest.approx(reference.item(), rel=1e-12)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], rtol=1e-10, atol=1e-12)


def test_one_packed_micro_batch_holds_every_sample_once(tokenizer):
    samples = [data.sft_sample(tokenizer, row, 64, f"r{i}") for i, row in enumerate(ROWS)]
    mb = collate(samples, tokenizer.pad_token_id, 4096)
    assert mb.num_tokens == sb.trained_tokens(samples)


def test_steps_take_each_example_once_an_epoch_in_a_seeded_order():
    epoch = [sb.step_indices(10, 4, step, seed=5, shuffle=True) for step in range(3)]
    assert sorted(i for step in epoch for i in step) == list(range(10))
    assert [len(s) for s in epoch] == [4, 4, 2]
    assert sb.step_indices(10, 4, 3, seed=5, shuffle=True) != epoch[0]
    assert sb.step_indices(10, 4, 1, seed=5, shuffle=False) == [4, 5, 6, 7]
