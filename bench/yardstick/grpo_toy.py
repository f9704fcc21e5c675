# The yardstick, copied unchanged (below this header) from the developers' reference folder,
# reference/grpo_toy.py: a plain synchronous GRPO loop in one file, the learning-speed reference
# that bench/longtail.py measures the repository's loop against (README.md beside it). Edit
# nothing below: a changed yardstick measures nothing (tests/test_longtail.py checks its sha256).

"""Plain synchronous GRPO on a toy verifiable task with a random-init tiny HF causal LM (CPU).

python grpo_toy.py --task add --time 180 --log logs/add.csv
Tasks (prompt -> target, reward = per-position partial credit over target+EOS):
  add     "3+4="   -> "7"      (a,b in 0..9)
  addmod  "3+4="   -> "7"      ((a+b)%10, single digit)
  rev     "3142>"  -> "2413"   (reverse n digits)
  sort    "3142>"  -> "1234"
  rep     "a5:"    -> "aaaaa"  (repeat char N times, char in a-e, N in 1..6)
"""
import argparse, os, time, math, random, csv, tempfile, json, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch, torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging
hf_logging.set_verbosity_error()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny import build_tokenizer, build_model


# ---------------------------------------------------------------- tasks
def make_task(name, ndig):
    def add():
        a, b = random.randint(0, 9), random.randint(0, 9); return f"{a}+{b}=", str(a + b)
    def addmod():
        a, b = random.randint(0, 9), random.randint(0, 9); return f"{a}+{b}=", str((a + b) % 10)
    def rev():
        d = "".join(random.choice("0123456789") for _ in range(ndig)); return d + ">", d[::-1]
    def sort():
        d = "".join(random.choice("0123456789") for _ in range(ndig)); return d + ">", "".join(sorted(d))
    def copy():
        d = "".join(random.choice("0123456789") for _ in range(ndig)); return d + ">", d
    def rep():
        c, n = random.choice("abcde"), random.randint(1, 6); return f"{c}{n}:", c * n
    return dict(add=add, addmod=addmod, rev=rev, sort=sort, rep=rep, copy=copy)[name]


EOS_W = 0.1
def reward_fn(comp_ids, target_ids, eos):
    """(1-EOS_W) * fraction of answer positions correct + EOS_W * [EOS right after answer]; 1.0 iff exact answer then EOS."""
    n = len(target_ids)
    hit = sum(1 for i, t in enumerate(target_ids) if i < len(comp_ids) and comp_ids[i] == t)
    eos_ok = float(len(comp_ids) > n and comp_ids[n] == eos)
    return (1 - EOS_W) * hit / n + EOS_W * eos_ok, float(hit == n and eos_ok)


# ---------------------------------------------------------------- sampling with KV cache
@torch.no_grad()
def sample(model, prompt_ids, max_new, eos, pad, temperature=1.0, greedy=False):
    """prompt_ids: [N, P] (equal length). Returns completions [N, T] (pad after EOS) and behaviour logprobs [N, T]."""
    N = prompt_ids.shape[0]
    out = model(input_ids=prompt_ids, use_cache=True)
    past, logits = out.past_key_values, out.logits[:, -1]
    toks, lps = [], []
    done = torch.zeros(N, dtype=torch.bool, device=prompt_ids.device)
    for t in range(max_new):
        logp = torch.log_softmax(logits.float() / temperature, -1)
        nxt = logp.argmax(-1) if greedy else torch.multinomial(logp.exp(), 1).squeeze(-1)
        lp = logp.gather(-1, nxt[:, None]).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
        toks.append(nxt); lps.append(torch.where(done, torch.zeros_like(lp), lp))
        done = done | (nxt == eos)
        if bool(done.all()) or t == max_new - 1:
            break
        out = model(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1]
    return torch.stack(toks, 1), torch.stack(lps, 1)


def completion_mask(comp, eos):
    # tokens up to and including first EOS
    is_eos = (comp == eos).int()
    after = (is_eos.cumsum(1) - is_eos) > 0
    return ~after


def token_logprobs(model, prompt_ids, comp, with_entropy=False):
    seq = torch.cat([prompt_ids, comp], 1)
    logits = model(input_ids=seq).logits[:, prompt_ids.shape[1] - 1:-1].float()
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, comp[..., None]).squeeze(-1)
    if with_entropy:
        return lp, -(logp.exp() * logp).sum(-1)
    return lp


# ---------------------------------------------------------------- main loop
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="add"); ap.add_argument("--ndig", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=128); ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4); ap.add_argument("--inter", type=int, default=512)
    ap.add_argument("--B", type=int, default=16, help="prompts per step"); ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3); ap.add_argument("--wd", type=float, default=0.0)
    ap.add_argument("--clip", type=float, default=0.2); ap.add_argument("--mu", type=int, default=2, help="minibatches (updates) per rollout batch")
    ap.add_argument("--temp", type=float, default=1.0)
    ap.add_argument("--time", type=float, default=180); ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--sft", type=int, default=0, help="SFT warm-start steps"); ap.add_argument("--sft_mode", default="format",
                    help="format: train on random digit strings of right length (no task knowledge); full: correct answers")
    ap.add_argument("--threads", type=int, default=2); ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="torch device of the whole loop (cpu, cuda)")
    ap.add_argument("--small_vocab", action="store_true", help="task-sized char vocab (24 tokens) instead of printable ASCII (100)")
    ap.add_argument("--eos_w", type=float, default=0.1); ap.add_argument("--beta", type=float, default=0.0, help="k3 KL to frozen init policy")
    ap.add_argument("--ent", type=float, default=0.0, help="entropy bonus (exact, full vocab)"); ap.add_argument("--no_std", action="store_true", help="Dr.GRPO: no std normalisation")
    ap.add_argument("--clip_high", type=float, default=None, help="DAPO clip-higher eps (default = --clip)"); ap.add_argument("--log", default=None); ap.add_argument("--target", type=float, default=0.95)
    a = ap.parse_args()
    global EOS_W; EOS_W = a.eos_w
    torch.set_num_threads(a.threads); random.seed(a.seed); torch.manual_seed(a.seed)

    # offline model via the real HF loading path
    d = tempfile.mkdtemp(prefix="tiny_")
    tok0 = build_tokenizer("0123456789+=>:abcde\n" if a.small_vocab else None); build_model(tok0, a.hidden, a.layers, a.heads, max(1, a.heads // 2), a.inter, seed=a.seed).save_pretrained(d)
    tok0.save_pretrained(d)
    tok = AutoTokenizer.from_pretrained(d); dev = torch.device(a.device); model = AutoModelForCausalLM.from_pretrained(d).to(dev); model.train()
    eos, pad = tok.eos_token_id, tok.pad_token_id
    nparam = sum(p.numel() for p in model.parameters())
    ref = None
    if a.beta > 0:
        ref = AutoModelForCausalLM.from_pretrained(d).to(dev).eval(); [p.requires_grad_(False) for p in ref.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.wd, betas=(0.9, 0.99))
    task = make_task(a.task, a.ndig)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    max_new = {"add": 3, "addmod": 2, "rev": a.ndig + 1, "sort": a.ndig + 1, "copy": a.ndig + 1, "rep": 7}[a.task]

    def batch_prompts(n):
        ps = [task() for _ in range(n)]
        return torch.tensor([enc(p) for p, _ in ps], device=dev), [enc(t) for _, t in ps]

    @torch.no_grad()
    def evaluate(n=256):
        model.eval(); P, T = batch_prompts(n); comp, _ = sample(model, P, max_new, eos, pad, greedy=True); model.train()
        rs = [reward_fn(c.tolist(), t, eos) for c, t in zip(comp, T)]
        return sum(r for r, _ in rs) / n, sum(e for _, e in rs) / n

    rows, t0, c0 = [], time.time(), time.process_time()
    logw = csv.writer(open(a.log, "w")) if a.log else None
    hdr = ["phase", "step", "wall_s", "cpu_s", "reward_mean", "exact_frac", "greedy_reward", "greedy_exact", "loss", "clipfrac", "entropy", "gen_s", "learn_s"]
    if logw: logw.writerow(hdr)
    print(json.dumps(vars(a)), f"params={nparam}", flush=True)

    # optional SFT warm start
    for s in range(a.sft):
        P, T = batch_prompts(a.B * a.G)
        if a.sft_mode == "format":   # right-length random digit strings: teaches format, not the answer
            T = [enc("".join(random.choice("0123456789") for _ in range(len(t)))) for t in T]
        L = max(len(t) for t in T) + 1
        comp = torch.tensor([t + [eos] + [pad] * (L - len(t) - 1) for t in T], device=dev)
        lp = token_logprobs(model, P, comp); m = completion_mask(comp, eos)
        loss = -(lp * m).sum() / m.sum(); opt.zero_grad(); loss.backward(); opt.step()
        if s % 20 == 0 or s == a.sft - 1:
            gr, ge = evaluate(); w = time.time() - t0
            print(f"sft {s:4d} t={w:6.1f}s loss={loss.item():.3f} greedy_r={gr:.3f} exact={ge:.3f}", flush=True)
            if logw: logw.writerow(["sft", s, f"{w:.2f}", f"{time.process_time()-c0:.2f}", "", "", f"{gr:.4f}", f"{ge:.4f}", f"{loss.item():.4f}", "", "", "", ""])

    for step in range(a.steps):
        tg = time.time()
        P, T = batch_prompts(a.B)
        P = P.repeat_interleave(a.G, 0); T = [t for t in T for _ in range(a.G)]
        model.eval(); comp, old_lp = sample(model, P, max_new, eos, pad, a.temp); model.train()
        rs = [reward_fn(c.tolist(), t, eos) for c, t in zip(comp, T)]
        r = torch.tensor([x for x, _ in rs]); ex = sum(e for _, e in rs) / len(rs)
        rg = r.view(a.B, a.G); adv = rg - rg.mean(1, keepdim=True)
        if not a.no_std: adv = adv / (rg.std(1, keepdim=True) + 1e-4)
        adv = adv.view(-1).to(dev)
        ref_lp = token_logprobs(ref, P, comp).detach() if ref is not None else None
        mask = completion_mask(comp, eos).float()
        gen_s = time.time() - tg; tl = time.time()
        idx = torch.randperm(len(r), device=dev).chunk(a.mu); tot_loss = 0; clipn = 0; ent_sum = 0.0
        for mb in idx:
            lp, ent = token_logprobs(model, P[mb], comp[mb], with_entropy=True)
            ratio = torch.exp(lp - old_lp[mb]); A = adv[mb, None]
            obj = torch.minimum(ratio * A, ratio.clamp(1 - a.clip, 1 + (a.clip_high or a.clip)) * A)
            if a.ent > 0: obj = obj + a.ent * ent
            if ref is not None:
                dlt = ref_lp[mb] - lp; obj = obj - a.beta * (torch.exp(dlt) - dlt - 1)
            loss = -(obj * mask[mb]).sum() / mask[mb].sum()   # token-level mean
            opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()
            tot_loss += loss.item(); ent_sum += (ent.detach() * mask[mb]).sum().item(); clipn += (((ratio - 1).abs() > a.clip).float() * mask[mb]).sum().item()
        learn_s = time.time() - tl; w = time.time() - t0
        row = dict(phase="rl", step=step, wall_s=w, cpu_s=time.process_time() - c0, reward_mean=r.mean().item(), exact_frac=ex, loss=tot_loss / a.mu,
                   clipfrac=clipn / mask.sum().item(), entropy=ent_sum / mask.sum().item(), gen_s=gen_s, learn_s=learn_s, greedy_reward="", greedy_exact="")
        if step % 25 == 0:
            gr, ge = evaluate(); row.update(greedy_reward=gr, greedy_exact=ge)
            print(f"rl {step:5d} t={w:6.1f}s cpu={time.process_time()-c0:6.1f}s r={row['reward_mean']:.3f} exact={ex:.3f} greedy_r={gr:.3f} greedy_exact={ge:.3f} "
                  f"clip={row['clipfrac']:.3f} H={row['entropy']:.2f} gen={gen_s*1e3:.0f}ms learn={learn_s*1e3:.0f}ms", flush=True)
        if logw:
            logw.writerow([row[k] if isinstance(row[k], str) else f"{row[k]:.4f}" for k in hdr])
        rows.append(row)
        if w > a.time: break
        if len(rows) >= 20 and sum(x["reward_mean"] for x in rows[-20:]) / 20 >= a.target:
            print(f"TARGET last20_reward>={a.target} at step={step} wall={w:.1f}s cpu={time.process_time()-c0:.1f}s", flush=True); break
    gr, ge = evaluate(1000)
    print(f"FINAL steps={step+1} wall={time.time()-t0:.1f}s cpu={time.process_time()-c0:.1f}s last20_reward={sum(x['reward_mean'] for x in rows[-20:])/min(20,len(rows)):.3f} "
          f"greedy_reward={gr:.3f} greedy_exact={ge:.3f}", flush=True)


if __name__ == "__main__":
    main()
