"""The demo task itself: a character-level tokenizer, the tiny policy, examples and the warm start.

The short format-only warm start is what makes RL from a random init work here (pure RL
from a random init collapsed on every task tried).
"""

from __future__ import annotations

import random
import string

PAD, EOS, IM_START, IM_END = "<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, EOS, IM_START, IM_END]
PROMPT_SUFFIX = ">"
# the AdamW betas of the warm start (no weight decay), the demo learner's (configs/demo_cpu.yaml), so RL
# can keep its moments
WARM_START_BETAS = (0.9, 0.99)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer():
    """Character-level fast tokenizer: every printable character is one token, no merges."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in string.printable:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        additional_special_tokens=[IM_START, IM_END],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(vocab_size: int, eos_id: int, pad_id: int, seed: int = 0):
    """Random-init Qwen2 of ~0.5M parameters (hidden 128, 2 layers, tied embeddings)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
    )
    return Qwen2ForCausalLM(config)


def make_example(rng: random.Random, digits: int = 3) -> dict[str, str]:
    number = "".join(rng.choice(string.digits) for _ in range(digits))
    return {"prompt": number + PROMPT_SUFFIX, "answer": number[::-1]}


def warm_start_rows(
    steps: int, batch: int, seed: int = 0, make=make_example
) -> list[dict[str, str]]:
    """The format warm start's examples, ``steps`` batches of ``batch`` in order: a prompt of
    ``make`` and a *random* digit string of its answer's length as the completion (the format,
    not the answer). ``format_warm_start`` trains on the same rows; the policy builders train on
    them with ``streamrl sft``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(steps * batch):
        ex = make(rng)
        target = "".join(rng.choice(string.digits) for _ in range(len(ex["answer"])))
        rows.append({"prompt": ex["prompt"], "completion": target})
    return rows


def format_warm_start(
    model,
    tokenizer,
    steps: int = 100,
    batch: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    optimizer=None,
    make=make_example,
) -> float:
    """Supervised steps on *random* digit strings of the right length + EOS.

    Teaches the output format (three digits, then stop), not the answer. With
    these defaults (100 steps at 1e-3 on 64) ~95 % of samples have the format and the reward
    sits at the chance level of the digits (~0.18 = 0.9 x 1/10 + 0.1 x 0.95), but the policy
    learns to ignore the prompt, which RL has to unlearn; the demo's policy builder
    (``assets.build_policy``) runs the lighter one of the synchronous loop it is measured
    against (60 steps at 3e-4 on 256), which leaves the format ~30 % learned (reward ~0.09)
    and the prompt not ignored (docs/bench/longtail.md). ``optimizer`` (an AdamW over ``model``, its lr set
    to ``lr`` here) lets a caller keep the moments for RL; by default a fresh one is
    made and dropped. ``make(rng)`` draws an example (another task's prompts and answer
    lengths). Returns the last loss. The policy builders run the same rows
    (``warm_start_rows``) through ``streamrl sft``; this loop is the warm start of the
    synchronous reference loop the benchmarks compare with (``bench.tasks``).
    """
    import torch

    rows = warm_start_rows(steps, batch, seed, make)
    if optimizer is None:
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=lr, betas=WARM_START_BETAS, weight_decay=0.0
        )
    for group in optimizer.param_groups:
        group["lr"] = lr
    model.train()
    loss = torch.tensor(0.0)
    for step in range(steps):
        chunk = rows[step * batch : (step + 1) * batch]
        texts = [row["prompt"] + row["completion"] for row in chunk]
        prompt_lens = [len(tokenizer(row["prompt"])["input_ids"]) for row in chunk]
        ids = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
        # right padding, never a label: under causal attention no real token sees it
        width = max(len(row) for row in ids)
        input_ids = torch.tensor(
            [row + [tokenizer.pad_token_id] * (width - len(row)) for row in ids],
            device=model.device,
        )
        labels = input_ids.clone()
        for row, plen in enumerate(prompt_lens):
            labels[row, :plen] = -100
            labels[row, len(ids[row]) :] = -100
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())


def distinct_examples(size: int, seed: int = 0, digits: int = 3) -> list[dict[str, str]]:
    """``size`` examples with distinct prompts in a seeded random order (at most ``10**digits``)."""
    if not 1 <= size <= 10**digits:
        raise ValueError(
            f"the demo task has {10**digits} distinct {digits}-digit prompts; cannot make {size}"
        )
    numbers = random.Random(seed).sample(range(10**digits), size)
    return [
        {"prompt": f"{n:0{digits}d}" + PROMPT_SUFFIX, "answer": f"{n:0{digits}d}"[::-1]}
        for n in numbers
    ]
