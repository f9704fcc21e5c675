"""The CPU demo task, "reverse 3 digits": prompt ``"314>"``, answer ``"413"`` then end-of-sequence.

Owns everything the demo needs that no model hub can give us here: a
character-level tokenizer, a random-init tiny Qwen2 policy, the short
format-only warm start that makes RL from a random init work (pure RL from a
random init collapsed on every task tried), the generated prompt dataset and
the verifiable rewards: ``reverse_digits`` (shaped, what is trained) and
``reverse_digits_exact`` (the exact-match rate, reported and used as the
preset's target with weight 0). ``python -m streamrl.actors.demo_task`` builds the
policy and dataset folders if they are missing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import string
from pathlib import Path

from streamrl.actors.rewards import completion_turn

PAD, EOS, IM_START, IM_END = "<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, EOS, IM_START, IM_END]
PROMPT_SUFFIX = ">"
# the reward part of ``reverse_digits_exact``: the exact-match rate the demo's target asks for
EXACT_PART = "reverse_digits_exact"
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


def _stopped(completion: str) -> tuple[str, bool]:
    """The completion without its final EOS, and whether it had one."""
    stopped = completion.endswith(EOS)
    return (completion[: -len(EOS)] if stopped else completion), stopped


def reverse_digits_reward(completion: str, answer: str) -> dict[str, float]:
    """0.9 x fraction of answer positions right + 0.1 x stopped right after the answer; exact = 1.0.

    ``completion`` is the decoded text *with* special tokens, ending in EOS when
    the completion stopped on it (see actors.rewards): a sampled ``<|pad|>`` or
    ``<|im_end|>`` occupies positions like any other token, so ``4<|pad|>13``
    is not the answer ``413``.
    """
    text, stopped = _stopped(completion)
    right = sum(1 for a, b in zip(text, answer, strict=False) if a == b)
    position = right / len(answer)
    stop = 1.0 if stopped and len(text) == len(answer) else 0.0
    return {"position": 0.9 * position, "stop": 0.1 * stop}


def _raw_text(messages) -> str:
    """The assistant turn's text with special tokens kept; without ``raw_content`` (a caller that
    only has the clean text) EOS is appended on a stop."""
    turn = completion_turn(messages)
    text = turn.get("raw_content")
    if text is None:
        text = turn["content"] + (EOS if turn.get("finish_reason") == "stop" else "")
    return text


def reverse_digits(messages, answer, **_) -> dict[str, float]:
    """The built-in reward ``reverse_digits``: the shaped reward above on the assistant turn."""
    return reverse_digits_reward(_raw_text(messages), str(answer))


def reverse_digits_exact(messages, answer, **_) -> float:
    """The built-in reward ``reverse_digits_exact``: 1 for exactly the answer, then EOS.

    The demo preset gives it weight 0: its mean is reported per step and is a target bar
    (``run.target_parts``), without changing the reward that is trained.
    """
    text, stopped = _stopped(_raw_text(messages))
    return float(stopped and text == str(answer))


def format_warm_start(
    model,
    tokenizer,
    steps: int = 100,
    batch: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    optimizer=None,
) -> float:
    """Supervised steps on *random* digit strings of the right length + EOS.

    Teaches the output format (three digits, then stop), not the answer. With
    these defaults ~95 % of samples have the format and the reward sits at the
    chance level of the digits (~0.18 = 0.9 x 1/10 + 0.1 x 0.95); a lighter warm start of 60
    steps at 3e-4 left the format at ~20 % (reward ~0.09), and RL then spent most
    of its time learning to stop. ``optimizer`` (an AdamW over ``model``, its lr set
    to ``lr`` here) lets a caller keep the moments for RL; by default a fresh one is
    made and dropped. Returns the last loss.
    """
    import torch

    rng = random.Random(seed)
    if optimizer is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99))
    for group in optimizer.param_groups:
        group["lr"] = lr
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        texts, prompt_lens = [], []
        for _ in range(batch):
            ex = make_example(rng)
            target = "".join(rng.choice(string.digits) for _ in range(len(ex["answer"])))
            texts.append(ex["prompt"] + target)
            prompt_lens.append(len(tokenizer(ex["prompt"])["input_ids"]))
        ids = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
        input_ids = torch.tensor(ids)
        labels = input_ids.clone()
        for row, plen in enumerate(prompt_lens):
            labels[row, :plen] = -100
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())


def ensure_demo_policy(
    path: str | os.PathLike, seed: int = 0, warm_start_steps: int = 100, warm_start_lr: float = 1e-3
) -> Path:
    """Build (once) the warmed demo policy as a Hugging Face folder; reuse it if present."""
    path = Path(path)
    if (path / "config.json").exists():
        return path
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, seed=seed)
    if warm_start_steps:
        format_warm_start(model, tokenizer, steps=warm_start_steps, lr=warm_start_lr, seed=seed)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    # atomic: concurrent builders never see half a folder
    os.replace(tmp, path)
    return path


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


def ensure_demo_dataset(path: str | os.PathLike, size: int = 1000, seed: int = 0) -> Path:
    """Write the demo prompts as JSONL (``prompt`` + ``answer``) if the file is missing.

    Every prompt is distinct (the default 1,000 rows are all 3-digit numbers,
    shuffled by ``seed``): rows drawn with replacement held only ~630 distinct prompts.
    """
    path = Path(path)
    if path.exists():
        return path
    rows = distinct_examples(size, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="runs/demo-policy")
    parser.add_argument("--data", default="runs/demo-data/train.jsonl")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    print(ensure_demo_policy(args.policy, seed=args.seed))
    print(ensure_demo_dataset(args.data, seed=args.seed))


if __name__ == "__main__":
    main()
