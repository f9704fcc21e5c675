"""configs: the one typed home of every knob, its default and its meaning.

Owns the config schema (``schema.py``), the loader with dotted command-line
overrides (``load.py``), the one redaction of secrets from a config (``redact.py``), how a
run's files are created and which directories a run trusts (``runfiles.py``),
TRL's and verl's names for its keys (``foreign.py``) and the translation of their config
files (``convert.py``), ``streamrl config show|convert`` (``__main__.py``) and the YAML presets beside them. Imports nothing from
the other streamrl packages; every other package imports it.
"""

from streamrl.configs.errors import ConfigError, StreamRLError
from streamrl.configs.load import (
    config_from_cli,
    load_config,
    parse_overrides,
    presets,
    write_config,
)
from streamrl.configs.schema import Config

__all__ = [
    "Config",
    "ConfigError",
    "config_from_cli",
    "load_config",
    "parse_overrides",
    "presets",
    "StreamRLError",
    "write_config",
]
