"""Functions a config names by reference: ``module:function`` or ``path/to/file.py:function``.

Rewards (``reward.functions``) and environments (``env.name``) are named this way; an error
says which key named the function and why it cannot be loaded.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

FORMS = "module:function or path/to/file.py:function"


def is_reference(ref: str) -> bool:
    """Whether ``ref`` has the form of a reference (both sides of the last ``:`` non-empty)."""
    module_name, sep, attr = ref.rpartition(":")
    return bool(sep and module_name and attr)


def _from_file(what: str, file: str):
    path = Path(file).resolve()
    if not path.is_file():
        raise ValueError(f"{what}: no file {file!r}")
    spec = importlib.util.spec_from_file_location(f"streamrl_plugin_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    # a user file may fail to import in any way
    except Exception as exc:
        raise ValueError(f"{what}: cannot import {file!r}: {_why(exc)}") from None
    return module


def _why(exc: Exception) -> str:
    """An import's failure in one line: a syntax error as ``file:line: message``."""
    if isinstance(exc, SyntaxError):
        return f"{exc.filename}:{exc.lineno}: {exc.msg}"
    return repr(exc)


def load(ref: str, what: str) -> Callable:
    """The function ``ref`` names; ValueError starting with ``what`` (e.g. ``reward.functions``) if none."""
    if not is_reference(ref):
        raise ValueError(f"{what}: {ref!r} is not {FORMS}")
    module_name, _, attr = ref.rpartition(":")
    if module_name.endswith(".py"):
        module = _from_file(what, module_name)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"{what}: cannot import {module_name!r}: {exc}") from None
        # a module that imports but fails in its own code: the user's, said in one line
        except Exception as exc:
            raise ValueError(f"{what}: cannot import {module_name!r}: {_why(exc)}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{what}: {module_name} has no callable {attr!r}")
    return fn
