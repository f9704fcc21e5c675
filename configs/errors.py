"""The one exception base every streamrl error derives from.

``except StreamRLError`` catches what streamrl raises on purpose (a bad config, a malformed
entry, a prompt file it cannot read, a failed weight push, ...) and nothing else; each
subclass also keeps the builtin base it had (``ValueError``, ``RuntimeError``, ...), so
existing ``except ValueError`` handlers still match. Imports nothing.
"""


class StreamRLError(Exception):
    """Base of every error streamrl raises on purpose."""


class ConfigError(StreamRLError, ValueError):
    """A config that cannot be used; the message names the key and the reason."""
