"""``streamrl.GRPOTrainer``, ``SFTTrainer``, ``DPOTrainer``: runs started from Python the way a
TRL user starts them.

    from streamrl import GRPOTrainer

    def reward_len(completions, **kwargs):
        return [-abs(20 - len(c[0]["content"])) for c in completions]

    trainer = GRPOTrainer(model="Qwen/Qwen2-0.5B-Instruct", reward_funcs=reward_len,
                          train_dataset=dataset, args="demo_cpu", callbacks=[print])
    summary = trainer.train()

``args`` is the run's config: a ``Config``, a preset name or YAML file, or a mapping of dotted
overrides on the built-in defaults; ``model``, ``train_dataset`` and ``reward_funcs`` replace what it
names (new ``reward_funcs`` drop the config's ``run.target_parts``, bars on the parts of the
functions they replace). A ``datasets.Dataset`` is saved as JSONL in the run directory (``dataset/train.jsonl``) and
read from there by the actors. ``train()`` runs ``streamrl.run`` (the learner and ``actors`` actor
processes, its own Redis) and returns its ``RunSummary``; each callback is called in this process
with every learner step row as the learner writes it.

Rewards run in the actor processes, which import them by name, so a reward function must be
importable there: a function at the top level of a module, or of the script being run. One
defined in the running script (``__main__``) is copied with the script's top-level imports into
``<run.dir>/rewards/`` (loading the script itself would run its training again); whatever else it
reads belongs in a module. A lambda, a nested function or a method is refused, saying why.

``SFTTrainer`` and ``DPOTrainer`` take ``model``, ``train_dataset`` (saved the same way, read as
``supervised.path``), ``args`` and ``callbacks``, and train in this process as ``streamrl sft`` /
``dpo`` do (``launch.supervised.run_supervised``).
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import site
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamrl.configs import Config
from streamrl.configs.errors import ConfigError
from streamrl.configs.load import load_config
from streamrl.configs.runfiles import check_run_dir, write_new
from streamrl.launch.run import RunSummary, run

if TYPE_CHECKING:
    from streamrl.learner.progress import Progress

DATASET = "dataset/train.jsonl"
REWARDS_DIR = "rewards"

RewardFunc = Callable[..., Any] | str


class _Trainer:
    """What every trainer does with its arguments: the config (``args`` with ``model`` and the
    dataset in their places), the dataset saved in the run directory, the callbacks."""

    # where the objective reads its dataset: data.path (prompts) or supervised.path (examples)
    dataset_key = ("data", "path")

    def __init__(
        self,
        model: str | None,
        train_dataset: Any,
        args: Config | str | Mapping[str, Any] | None,
        callbacks: Iterable[Callable[[dict], None]],
    ) -> None:
        base = args if isinstance(args, Config) else _base_config(args)
        self.run_dir = Path(base.run.dir)
        self.tree = base.model_dump(mode="json")
        if model is not None:
            self.tree["model"]["path"] = model
        if train_dataset is not None:
            section, key = self.dataset_key
            self.tree[section][key] = self._dataset_path(train_dataset)
        self.callbacks = list(callbacks)

    def _on_step(self, row: dict) -> None:
        for callback in self.callbacks:
            callback(row)

    def _dataset_path(self, dataset: Any) -> str:
        """A path as it is; a ``datasets.Dataset`` (or any iterable of dict rows) as JSONL in the run
        directory."""
        if isinstance(dataset, (str, os.PathLike)):
            return str(dataset)
        rows = "".join(json.dumps(dict(row)) + "\n" for row in dataset)
        if not rows:
            raise ConfigError("train_dataset has no rows")
        path = self.run_dir / DATASET
        _private_dir(self.run_dir, path.parent)
        write_new(path, rows)
        return str(path)


class GRPOTrainer(_Trainer):
    """GRPO on streamrl's actors and learner, configured from Python (module docstring)."""

    def __init__(
        self,
        model: str | None = None,
        reward_funcs: RewardFunc | Iterable[RewardFunc] = (),
        train_dataset: Any = None,
        args: Config | str | Mapping[str, Any] | None = None,
        callbacks: Iterable[Callable[[dict], None]] = (),
        actors: int = 2,
    ) -> None:
        super().__init__(model, train_dataset, args, callbacks)
        funcs = (
            [reward_funcs]
            if callable(reward_funcs) or isinstance(reward_funcs, str)
            else list(reward_funcs)
        )
        if funcs:
            # bars on the replaced functions' parts no longer name a part of this task
            self.tree["run"]["target_parts"] = {}
            # a function's reward parts carry its name, as TRL's reward columns do
            self.tree["reward"]["functions"] = [
                {"fn": f} if isinstance(f, str) else {"fn": self._reference(f), "name": f.__name__}
                for f in funcs
            ]
        self.config = Config.model_validate(self.tree)
        self.actors = actors

    def train(self) -> RunSummary:
        """Run to the config's end (``run.max_steps``, ``run.max_time_s``, its target)."""
        return run(self.config, actors=self.actors, on_step=self._on_step)

    def _reference(self, fn: Callable) -> str:
        """What ``reward.functions[].fn`` names for the function ``fn``: where the actors can import
        it from."""
        name = getattr(fn, "__qualname__", "")
        if not inspect.isfunction(fn) or "." in name or name == "<lambda>":
            raise ConfigError(
                f"reward_funcs: {fn!r} is a lambda, a nested function or a method; rewards run in "
                "the actor processes, which import them by name: define it at the top level of "
                "a module or of your script"
            )
        module = sys.modules.get(fn.__module__)
        file = getattr(module, "__file__", None)
        if file is None:
            raise ConfigError(f"reward_funcs: {name} was not defined in a file the actors can read")
        if fn.__module__ == "__main__":
            return f"{self._copied(fn, Path(file))}:{name}"
        if fn.__module__.partition(".")[0] == "streamrl" or any(
            Path(file).resolve().is_relative_to(root) for root in _site_packages()
        ):
            return f"{fn.__module__}:{name}"
        return f"{Path(file).resolve()}:{name}"

    def _copied(self, fn: Callable, script: Path) -> Path:
        """``fn``'s source after the top-level imports of ``script``, as a module in the run
        directory."""
        source = script.read_text()
        imports = [
            ast.get_source_segment(source, node)
            for node in ast.parse(source).body
            if isinstance(node, (ast.Import, ast.ImportFrom))
        ]
        path = self.run_dir / REWARDS_DIR / f"{fn.__name__}.py"
        _private_dir(self.run_dir, path.parent)
        header = (
            f"# {fn.__name__} from {script}, with that script's imports (streamrl.GRPOTrainer)\n"
        )
        write_new(path, header + "\n".join(imports) + "\n\n\n" + inspect.getsource(fn))
        return path


class SFTTrainer(_Trainer):
    """``streamrl sft`` in this process: ``train_dataset`` rows of ``messages``, ``prompt`` +
    ``completion`` or ``text`` (``learner.supervised_data``); ``train()`` returns the learner's
    ``Progress``. Like the command, it sets this process's umask for the run directory's files."""

    dataset_key = ("supervised", "path")

    def __init__(
        self,
        model: str | None = None,
        train_dataset: Any = None,
        args: Config | str | Mapping[str, Any] | None = None,
        callbacks: Iterable[Callable[[dict], None]] = (),
    ) -> None:
        super().__init__(model, train_dataset, args, callbacks)
        self.config = Config.model_validate(self.tree)

    @staticmethod
    def _kind():
        from streamrl.learner.sft import SFT

        return SFT

    def train(self) -> Progress:
        from streamrl.launch.supervised import run_supervised

        return run_supervised(self.config, self._kind(), on_row=self._on_step)


class DPOTrainer(SFTTrainer):
    """``streamrl dpo`` in this process: ``train_dataset`` rows of ``chosen`` + ``rejected``
    (after a ``prompt``, or as whole chats); as ``SFTTrainer`` otherwise."""

    @staticmethod
    def _kind():
        from streamrl.learner.dpo import DPO

        return DPO


def _base_config(args: str | Mapping[str, Any] | None) -> Config:
    if isinstance(args, Mapping):
        return load_config(None, dict(args))
    return load_config(args)


def _private_dir(run_dir: Path, folder: Path) -> None:
    """``folder`` below ``run_dir``, both made 0700 where missing, under the run-directory policy."""
    check_run_dir(run_dir)
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)


def _site_packages() -> list[Path]:
    """Where an installed module imports from, in any process of this interpreter."""
    return [Path(p).resolve() for p in site.getsitepackages()]
