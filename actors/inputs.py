"""A run's inputs before anything loads them: the policy at ``model.path``, the prompts at ``data.path``.

Nothing fills in a missing input (no config key builds one: ``streamrl example`` makes the
examples'). Each is checked at start, before the run directory, Redis or any process exists: a
missing one stops the start in one line naming its key, and the command that makes it when the
path is an example's (``configs.example_inputs``). A hub id resolves through the hub cache
(``policy.load.model_folder``; with ``HF_HUB_OFFLINE=1``, only the cache).
"""

from __future__ import annotations

import os

from streamrl.actors.prompt_data import check_dataset_path
from streamrl.configs.errors import ConfigError
from streamrl.configs.example_inputs import example_making, missing
from streamrl.configs.schema import DataConfig, ModelConfig


def check_example_path(key: str, path: str, along: tuple[str, ...] = ()) -> None:
    """ConfigError naming ``key`` and the command that makes it when ``path`` is an example's
    and is missing (checked before the hub is asked: such a path is never a hub id); ``along``:
    the config's other paths, which pick the example (``configs.example_inputs``)."""
    if example_making(path) and not os.path.lexists(path):
        raise ConfigError(missing(key, path, along))


def check(model: ModelConfig, data: DataConfig | None) -> None:
    """Both paths set and there (``data`` None: a learner node, which reads no prompts).

    The launcher calls it before any child starts; a lone actor (``make actors``) and a learner
    node (``streamrl learner``) call it too, as each may run without a launcher.
    """
    if not model.path:
        raise ConfigError("model.path is not set: name a Hugging Face model folder or hub id")
    check_example_path("model.path", model.path, (data.path,) if data is not None else ())
    # here, not at the top: policy.load imports torch, which the launcher does without
    from streamrl.policy.load import model_folder

    model_folder(model.path)
    if data is not None:
        if not data.path:
            raise ConfigError(
                "data.path is not set: name a prompt dataset (file, folder or hub id)"
            )
        check_example_path("data.path", data.path, (model.path,))
        check_dataset_path(data.path)
