"""hf engine decode tokens/s against transformers' ``model.generate`` with a static cache and
compiled, CUDA-graph decoding, on the same model and device, measured back to back in one run.

    python -m bench.decode --device cuda --shape qwen05b --slots 256     (a lent GPU: the check)
    python -m bench.decode --cpu                                          (smoke run, tiny shape)

Both sides get the same random prompts (one length, so ``generate`` needs no padding) and sample
exactly ``--new-tokens`` tokens each (no stop token: ``min_new_tokens`` holds ``generate`` to the
count), prefill included. ``generate`` takes ``cache_implementation="static"``, with which
transformers compiles the decode step (``torch.compile`` mode reduce-overhead: CUDA graphs) on a
GPU by itself; it is measured uncompiled too (``disable_compile``) and first, so that a compile
that fails (it needs a C compiler) or runs out the time still leaves a comparison. Each row
prints as it is measured; a run that raises prints its error as its row. Each side runs once
untimed first (graph capture, compilation), then timed. The engine is measured with
``actor.hf.cuda_graphs`` on (``graphs``) and off (``dynamic``, the decode loop the issue
measured). The exit status is 1 when graphs / the faster generate falls below
``--min-ratio`` (the issue's bar, 0.8; 0 on the CPU smoke, whose ``static`` runs eagerly).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from bench.weightsync import SHAPES, build_model
from streamrl.actors.engines.base import Request, SamplingParams
from streamrl.actors.engines.hf.engine import HFEngine
from streamrl.policy.load import resolve_dtype


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(run, device: torch.device) -> tuple[int, float]:
    """(tokens, seconds) of ``run()``, after one untimed run."""
    run()
    _sync(device)
    start = time.perf_counter()
    tokens = run()
    _sync(device)
    return tokens, time.perf_counter() - start


def engine_run(model, prompts: torch.Tensor, new_tokens: int, slots: int, decode: str):
    engine = HFEngine(model, None, batch_slots=slots, seed=0, decode=decode)
    requests = [Request(str(i), row.tolist()) for i, row in enumerate(prompts)]
    params = SamplingParams(max_new_tokens=new_tokens)

    def run() -> int:
        outputs = engine.generate(requests, params)
        return sum(len(o.token_ids) for o in outputs)

    return run


def generate_run(model, prompts: torch.Tensor, new_tokens: int, compiled: bool = True):
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, temperature=1.0,
        top_k=0, top_p=1.0, cache_implementation="static", pad_token_id=0,
        disable_compile=not compiled,
    )  # fmt: skip
    ids = prompts.to(model.device)
    mask = torch.ones_like(ids)

    def run() -> int:
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        return (out.shape[1] - ids.shape[1]) * ids.shape[0]

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen05b")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--slots", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--min-ratio", type=float, default=0.8)
    parser.add_argument(
        "--cpu", action="store_true", help="smoke run: tiny shape on CPU, a few slots and tokens"
    )
    args = parser.parse_args(argv)
    if args.cpu:
        args.shape, args.device, args.slots = "tiny", "cpu", 4
        args.prompt_tokens, args.new_tokens, args.min_ratio = 8, 6, 0.0
    device = torch.device(args.device)
    model = build_model(args.shape, args.device, resolve_dtype("auto", args.device))
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(
        10, model.config.vocab_size, (args.slots, args.prompt_tokens), generator=gen
    )
    static = "graphs" if device.type == "cuda" else "static"
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"## hf engine decode vs generate: {args.shape} on {where}, {args.slots} slots, "
        f"{args.prompt_tokens} prompt + {args.new_tokens} new tokens each\n"
    )
    print("| run | tokens | seconds | tokens/s |\n|---|---:|---:|---:|", flush=True)
    runs = (
        (f"hf engine, {static}", engine_run(model, prompts, args.new_tokens, args.slots, static)),
        ("hf engine, dynamic", engine_run(model, prompts, args.new_tokens, args.slots, "dynamic")),
        # uncompiled first: a compile that fails or runs out the check's time still leaves a
        # comparison against generate
        ("generate, static cache", generate_run(model, prompts, args.new_tokens, compiled=False)),
        ("generate, static cache, compiled", generate_run(model, prompts, args.new_tokens)),
    )
    rows = {name: measured_row(name, run, device) for name, run in runs}
    return 0 if ratios(rows, f"hf engine, {static}", args.min_ratio) else 1


def measured_row(name: str, run, device: torch.device) -> tuple[int, float] | None:
    """Time ``run`` and print its row at once (flushed: a later run's timeout keeps it); a run
    that raises prints its error as the row and gives None."""
    try:
        tokens, seconds = _timed(run, device)
    except Exception as error:  # a compile error is a result here, not the end of the check
        print(f"| {name} | failed: {type(error).__name__}: {str(error)[:200]} | | |", flush=True)
        return None
    print(f"| {name} | {tokens} | {seconds:.3f} | {tokens / seconds:,.0f} |", flush=True)
    return tokens, seconds


def ratios(rows: dict[str, tuple[int, float] | None], ours: str, min_ratio: float) -> bool:
    """Print ours / each generate row measured; whether ours reaches ``min_ratio`` against the
    best generate (the compiled one when it ran)."""
    if rows[ours] is None:
        return False
    speed = {name: row[0] / row[1] for name, row in rows.items() if row is not None}
    print()
    for name in (n for n in speed if n.startswith("generate")):
        print(f"ratio {ours} / {name}: {speed[ours] / speed[name]:.2f} (min {min_ratio})")
    best = max((v for n, v in speed.items() if n.startswith("generate")), default=None)
    return best is not None and speed[ours] / best >= min_ratio


if __name__ == "__main__":
    sys.exit(main())
