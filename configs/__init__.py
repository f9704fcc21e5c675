"""configs: the one typed home of every knob, its default and its meaning.

Owns the config schema: ``schema`` composes the whole ``Config`` from one module per component
(``run``, ``broker``, ``model``, ``data``, ``rollout``, ``reward``, ``actor``, ``learner``,
``weightsync``) on the base ``section``; the loader with dotted command-line overrides
(``load``), the one bounded reader of every YAML document a command loads (``yamlfile``), the
one redaction of secrets from a config (``redact``), how a run's files are created and which
directories a run trusts (``runfiles``), TRL's and verl's names for its keys
(``foreign``) and the translation of their config files (``convert``; its vocabulary
``convert_types``; its per-field rules in ``convert_rules``, ``convert_schedule`` and
``convert_rewards``; the catalogue of every field it reads in ``convert_fields`` and
``convert_verl_fields``; the doc's tables written from it by ``convert_doc``), where the keys of an older streamrl went (``renamed``), the configuration
reference (``reference``), ``streamrl config show|convert``
(``__main__``) and the YAML presets beside them.

Every other package imports it. It imports, of the others, only the two registries whose
backends bring their own settings: ``actors.engines`` (each engine's options, the section
``actor.<engine>``) and ``weightsync.transports`` (``weightsync.<transport>``); both are light
(no torch) and take from ``configs`` only its leaf modules ``section`` and ``errors``.

The names below load on first use (PEP 562), so importing one leaf module (``errors``,
``section``) does not build the whole schema.
"""

from __future__ import annotations

import importlib
import typing

_EXPORTS = {
    "Config": "schema",
    "ConfigError": "errors",
    "StreamRLError": "errors",
    "config_from_cli": "load",
    "load_config": "load",
    "parse_overrides": "load",
    "presets": "load",
    "write_config": "load",
}

__all__ = [
    "Config",
    "ConfigError",
    "StreamRLError",
    "config_from_cli",
    "load_config",
    "parse_overrides",
    "presets",
    "write_config",
]

if typing.TYPE_CHECKING:
    from streamrl.configs.errors import ConfigError, StreamRLError
    from streamrl.configs.load import (
        config_from_cli,
        load_config,
        parse_overrides,
        presets,
        write_config,
    )
    from streamrl.configs.schema import Config


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
