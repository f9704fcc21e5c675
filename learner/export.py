"""Export the trained policy as a Hugging Face folder that transformers and vLLM load.

    python -m streamrl.learner.export --config configs/demo_cpu.yaml [--checkpoint DIR] [--out DIR]

Reads the newest checkpoint under ``<run.dir>/checkpoints`` (or ``--checkpoint``), puts
its weights into the model of ``model.path`` and writes ``config.json``, the weights as
``model.safetensors``, the generation config, the tokenizer and ``streamrl_export.json``
(step, version, source) to ``<run.dir>/policy`` (or ``--out``). A LoRA policy (``model.lora``)
is written merged, with its PEFT adapter folder in ``adapter/``. The learner does the same
with its live weights at the end of a run (``run.export_at_end``).

The folder is written next to its destination and renamed into place, so a reader never
sees half an export, and a link planted at the destination is replaced, never written
through. The command reads and writes ``run.dir`` under the run-directory policy
(``configs.runfiles``): only one only its user can change, through no link, its files the
user's only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from streamrl.configs import config_from_cli
from streamrl.configs.errors import ConfigError
from streamrl.configs.runfiles import check_run_dir, restrict_umask
from streamrl.configs.schema import ModelConfig, RunConfig

if TYPE_CHECKING:
    import torch

EXPORT_DIR = "policy"
CHECKPOINTS = "checkpoints"
INFO_FILE = "streamrl_export.json"
# DeepSpeed keeps the full module weights of every ZeRO stage <= 2 in this file of the tag folder
MODEL_STATES = "mp_rank_00_model_states.pt"


def default_out(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / EXPORT_DIR


def export_policy(model, tokenizer, out: str | os.PathLike, info: dict) -> Path:
    """Write ``model`` + ``tokenizer`` as a Hugging Face folder at ``out`` (replaced atomically); a
    LoRA policy as its merged weights with its PEFT adapter folder in ``adapter/``
    (``policy.lora.save_export``)."""
    from streamrl.policy.lora import save_export

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_export(model, staging)
        tokenizer.save_pretrained(staging)
        (staging / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        if out.is_symlink():
            # replaced, as configs.runfiles.write_new replaces one: never written through
            out.unlink()
        elif out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def checkpoint_weights(folder: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict]:
    """The module weights and client state of one checkpoint folder (``.../step-N``)."""
    import torch

    from streamrl.learner.checkpoint import TAG

    path = Path(folder) / TAG / MODEL_STATES
    if not path.exists():
        raise FileNotFoundError(f"{folder}: no DeepSpeed model states at {path}")
    # weights_only: a checkpoint folder is a file like any other; loading it must not run code
    state = torch.load(path, map_location="cpu", weights_only=True)
    progress = (state.get("progress") or {}) if isinstance(state, dict) else {}
    return state["module"], progress


def export_checkpoint(
    model_cfg: ModelConfig,
    run_dir: str | os.PathLike,
    checkpoint: str | os.PathLike | None,
    out: Path,
) -> Path:
    """Export ``checkpoint`` (default: the newest under ``<run_dir>/checkpoints``) into the model
    of ``model_cfg``."""
    from streamrl.learner import checkpoint as ckpt
    from streamrl.policy.load import load_policy, load_tokenizer
    from streamrl.policy.lora import training_policy

    folder = Path(checkpoint) if checkpoint else ckpt.latest(Path(run_dir) / CHECKPOINTS)
    if folder is None:
        raise FileNotFoundError(f"no checkpoint under {Path(run_dir) / CHECKPOINTS}")
    weights, progress = checkpoint_weights(folder)
    model = training_policy(
        load_policy(model_cfg.path, model_cfg.dtype, init_kwargs=model_cfg.init_kwargs),
        model_cfg.lora,
    )
    model.load_state_dict(weights, strict=True)
    info = {
        "step": progress.get("step"),
        "version": progress.get("version"),
        "source": model_cfg.path,
        "checkpoint": str(folder),
    }
    return export_policy(model, load_tokenizer(model_cfg.path), out, info)


def export_at_end(run: RunConfig, source: str, model, step: int, version: int) -> Path | None:
    """The learner's end-of-run export of its live weights (rank 0), when ``run.export_at_end``;
    ``source`` is ``model.path``, where the tokenizer comes from."""
    if not run.export_at_end or step == 0:
        return None
    from streamrl.policy.load import load_tokenizer

    info = {"step": step, "version": version, "source": source}
    return export_policy(model, load_tokenizer(source), default_out(run.dir), info)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="streamrl export", description=__doc__.strip().splitlines()[0]
    )
    parser.add_argument("--checkpoint", help="checkpoint folder (default: the run's latest)")
    parser.add_argument("--out", help="output folder (default: <run.dir>/policy)")
    args, cfg = config_from_cli(parser, argv)
    try:
        # the run-directory policy when it reads the run's checkpoint or writes its policy there
        # (what it writes is its user's only, wherever it goes)
        if not (args.checkpoint and args.out):
            check_run_dir(cfg.run.dir, dirs=(CHECKPOINTS, EXPORT_DIR))
    except ConfigError as exc:
        print(f"streamrl export: {exc}", file=sys.stderr)
        return 2
    restrict_umask(cfg.run.shared_read)
    import torch

    torch.set_num_threads(cfg.run.torch_threads)
    try:
        out = export_checkpoint(
            cfg.model,
            cfg.run.dir,
            args.checkpoint,
            Path(args.out) if args.out else default_out(cfg.run.dir),
        )
    except (FileNotFoundError, RuntimeError, KeyError) as exc:
        print(f"export: {exc}", file=sys.stderr)
        return 2
    print(f"exported the policy to {out} (load it with from_pretrained or vLLM)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
