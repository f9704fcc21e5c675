"""A run's inputs before anything loads them: the policy at ``model.path``, the prompts at ``data.path``.

A path that does not exist is filled only by the hook a config names for it
(``model.build``, ``data.build``: ``module:function``, called as ``fn(path,
seed=run.seed)``), and only at the path declared with it (``configs.load`` drops a hook
whose path an override moved); the CPU demo's preset names its builders so. Without a
hook a missing input is an error naming its key, before any hook runs, never a substitute.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from streamrl.actors import plugins
from streamrl.actors.prompt_data import check_dataset_path
from streamrl.configs.errors import ConfigError
from streamrl.configs.schema import DataConfig, ModelConfig

log = logging.getLogger(__name__)


def _build(key: str, ref: str, path: str, seed: int) -> None:
    try:
        build = plugins.load(ref, key)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    build(path, seed=seed)


def prepare(
    model: ModelConfig,
    data: DataConfig | None,
    seed: int,
    announce: Callable[[str], None] = log.info,
) -> None:
    """Check both paths are set, and build the missing ones that have a hook (once; safe to race).

    The launcher calls it before any child starts; a lone actor (``make actors``) calls it
    too, so it runs without a launcher, and so does a learner node (``streamrl learner``), which
    reads no prompts (``data`` None). The hooks write atomically, and a later run finds what the
    first one built.
    """
    if not model.path:
        raise ConfigError("model.path is not set: name a Hugging Face model folder or hub id")
    if data is not None and not data.path:
        raise ConfigError("data.path is not set: name a prompt dataset (file, folder or hub id)")
    # what no hook fills must be there before a hook builds anything: a start that fails on a
    # user's path (a typo, a hub id not in the cache) leaves nothing behind
    if not model.build:
        # here, not at the top: policy.load imports torch, which the launcher does without
        from streamrl.policy.load import model_folder

        model_folder(model.path)
    if data is not None and not data.build:
        check_dataset_path(data.path)
    if model.build and not os.path.exists(model.path):
        announce(f"building the policy at {model.path} with model.build {model.build} (once)")
        _build("model.build", model.build, model.path, seed)
    if data is not None and data.build and not os.path.exists(data.path):
        announce(f"writing the dataset at {data.path} with data.build {data.build} (once)")
        _build("data.build", data.build, data.path, seed)
