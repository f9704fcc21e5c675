# Part of the yardstick, copied unchanged (below this header) from the developers' reference
# folder, reference/make_tiny.py: the char tokenizer and tiny Qwen2 that grpo_toy.py beside it
# builds (README.md beside it). Edit nothing below: a changed yardstick measures nothing
# (tests/test_longtail.py checks its sha256).

"""Build an offline tiny causal LM + tokenizer, save_pretrained, reload via from_pretrained.

Usage: python make_tiny.py OUTDIR [--hidden 128 --layers 2 --heads 4 --kv 2 --inter 512 --arch qwen2|llama]
"""
import argparse, os, time, json
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
import torch
from tokenizers import Tokenizer, models, decoders
from transformers import (PreTrainedTokenizerFast, AutoTokenizer, AutoModelForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, LlamaConfig, LlamaForCausalLM)

SPECIALS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]          # printable ASCII, 1 char = 1 token
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build_tokenizer(chars=None):
    """chars=None: printable ASCII (~100 tokens); or e.g. "0123456789+=>:abcde" for a task-sized vocab."""
    vocab = {t: i for i, t in enumerate(SPECIALS + (list(chars) if chars else CHARS))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))  # char-level: no merges
    tok.decoder = decoders.Fuse()                                          # join chars without spaces
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                 pad_token="<|pad|>", additional_special_tokens=["<|im_start|>"],
                                 chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False)
    return hf


def build_model(tok, hidden=128, layers=2, heads=4, kv=2, inter=512, arch="qwen2", max_pos=512, seed=0):
    torch.manual_seed(seed)
    kw = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=max_pos,
              tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
              pad_token_id=tok.pad_token_id, torch_dtype="float32")
    cfg = Qwen2Config(**kw) if arch == "qwen2" else LlamaConfig(**kw)
    return (Qwen2ForCausalLM if arch == "qwen2" else LlamaForCausalLM)(cfg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out"); ap.add_argument("--hidden", type=int, default=128); ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4); ap.add_argument("--kv", type=int, default=2)
    ap.add_argument("--inter", type=int, default=512); ap.add_argument("--arch", default="qwen2")
    a = ap.parse_args()
    t = time.time(); tok = build_tokenizer(); model = build_model(tok, a.hidden, a.layers, a.heads, a.kv, a.inter, a.arch)
    t_build = time.time() - t
    t = time.time(); tok.save_pretrained(a.out); model.save_pretrained(a.out); t_save = time.time() - t
    t = time.time(); tok2 = AutoTokenizer.from_pretrained(a.out); t_tok = time.time() - t
    t = time.time(); m2 = AutoModelForCausalLM.from_pretrained(a.out); t_model = time.time() - t
    # sanity: identical weights, round-trip text, chat template
    sd1, sd2 = model.state_dict(), m2.state_dict()
    assert all(torch.equal(sd1[k], sd2[k]) for k in sd1)
    s = "12+34=46"; ids = tok2(s)["input_ids"]; assert tok2.decode(ids) == s, (ids, tok2.decode(ids))
    chat = tok2.apply_chat_template([{"role": "user", "content": "3+4="}], add_generation_prompt=True, tokenize=False)
    files = {f: os.path.getsize(os.path.join(a.out, f)) for f in sorted(os.listdir(a.out))}
    print(json.dumps(dict(type=type(m2).__name__, params=sum(p.numel() for p in m2.parameters()), vocab=len(tok2),
                          ids=ids, chat=chat, files=files, build_s=round(t_build, 3), save_s=round(t_save, 3),
                          load_tok_s=round(t_tok, 3), load_model_s=round(t_model, 3)), indent=1))


if __name__ == "__main__":
    main()
