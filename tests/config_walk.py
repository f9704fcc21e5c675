"""Where a process's config goes: a static walk of the files its config objects reach.

From a process root (a function given the whole ``Config``), follow every call that passes the
config or one of its sections on to the function or class it calls, and from there on the same
way. A value is config while it is the ``Config`` or a section of it (``cfg.actor``,
``self.model_cfg``): the files reached are the ones that depend on the config's shape, which a
reader opens to learn what the process does with its settings. A plain field handed on
(``cfg.actor.batch_slots``, an int) decouples the callee from the config and is not followed,
unless ``follow_fields`` asks for it.

Calls are resolved the way a reader resolves them: names a module defines or imports from
``streamrl``, ``self.method``, ``Class.method``, ``Class(...)`` (its ``__init__``), methods of an
object built here with config, and a registry lookup (``engines.get(name).from_config(...)``):
the implementation one config picks (``chosen``), or every one the registry lists.
``**cfg.sections_for(fn)`` passes the sections ``fn`` names as keyword-only parameters.
"""

from __future__ import annotations

import ast
import typing
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from streamrl.configs import schema

ROOT = Path(__file__).resolve().parents[1]
# the streamrl subpackages, each a top-level folder of the same name (pyproject's package-dir)
PACKAGES = ("actors", "broker", "configs", "launch", "learner", "policy", "runtime", "weightsync")
CONFIG_TYPES = {
    name: obj
    for name, obj in vars(schema).items()
    if isinstance(obj, type) and issubclass(obj, BaseModel)
}


class Field(BaseModel):
    """Stands for a plain field's value, while fields are followed."""


def module_file(dotted: str) -> Path | None:
    """``streamrl.actors.loop`` -> actors/loop.py (or the package's __init__.py)."""
    parts = dotted.split(".")
    if parts[0] != "streamrl" or len(parts) < 2 or parts[1] not in PACKAGES:
        return None
    base = ROOT.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _section(annotation) -> type[BaseModel] | None:
    """The config class of a field's annotation (``X``, ``X | None``), else None (a plain field)."""
    for arm in (annotation, *typing.get_args(annotation)):
        if isinstance(arm, type) and issubclass(arm, BaseModel):
            return arm
    return None


@dataclass
class Module:
    path: Path
    # local name -> (module, attribute) imported from streamrl; attribute None = the module itself
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    # registry dicts: names of the classes listed in ``{c.name: c for c in (A, B)}``
    registered: list[str] = field(default_factory=list)


_modules: dict[Path, Module] = {}


def load(path: Path) -> Module:
    if path in _modules:
        return _modules[path]
    tree = ast.parse(path.read_text())
    mod = Module(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                whole = f"{node.module}.{alias.name}"
                mod.imports[alias.asname or alias.name] = (
                    (whole, None) if module_file(whole) else (node.module, alias.name)
                )
        elif isinstance(node, ast.DictComp) and isinstance(node.generators[0].iter, ast.Tuple):
            mod.registered += [
                e.id for e in node.generators[0].iter.elts if isinstance(e, ast.Name)
            ]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mod.functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            mod.classes[node.name] = node
    _modules[path] = mod
    return mod


def _method(cls: ast.ClassDef, name: str):
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


@dataclass(frozen=True)
class Target:
    module: Module
    function: ast.FunctionDef
    cls: ast.ClassDef | None = None

    @property
    def name(self) -> str:
        return f"{self.cls.name}.{self.function.name}" if self.cls else self.function.name


# what a local name may stand for besides config: an object of a class built here, or one of the
# classes a registry lookup returns
Classes = list[tuple[Module, ast.ClassDef]]


class Walk:
    """Visits the functions reached with config; ``files`` in first-visit order."""

    def __init__(self, follow_fields: bool = False, chosen: dict[str, str] | None = None) -> None:
        """``chosen``: registry module (``actors/engines/__init__.py``) -> the class one actor's
        config picks from it; a registry not named here stands for every class it lists."""
        self.follow_fields = follow_fields
        self.chosen = chosen or {}
        self.files: list[Path] = []
        self._seen: set[tuple] = set()
        # the config a class's __init__ was given, by class
        self._init_params: dict[int, dict[str, type[BaseModel]]] = {}

    def start(self, path: Path, function: str, params: dict[str, type[BaseModel]]) -> Walk:
        mod = load(path)
        cls_name, _, fn_name = function.rpartition(".")
        if cls_name:
            cls = mod.classes[cls_name]
            self._visit(Target(mod, _method(cls, fn_name), cls), params)
        else:
            self._visit(Target(mod, mod.functions[fn_name]), params)
        return self

    def relative_files(self) -> list[str]:
        return [str(p.relative_to(ROOT)) for p in self.files]

    def _visit(self, target: Target, params: dict[str, type[BaseModel]]) -> None:
        key = (target.module.path, target.name, frozenset(params.items()))
        if key in self._seen:
            return
        self._seen.add(key)
        if target.module.path not in self.files:
            self.files.append(target.module.path)
        if target.cls is not None and target.function.name == "__init__":
            self._init_params.setdefault(id(target.cls), {}).update(params)
        attrs = self._class_attrs(target.cls) if target.cls is not None else {}
        self._body(target, dict(params), attrs)
        # an object holding config may hand it on from any of its methods
        if attrs and target.function.name == "__init__":
            for node in target.cls.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self._visit(Target(target.module, node, target.cls), {})

    def _class_attrs(self, cls: ast.ClassDef) -> dict[str, type[BaseModel]]:
        """``self.x = <config>`` in ``__init__`` makes ``self.x`` config in every method."""
        init = _method(cls, "__init__")
        if init is None:
            return {}
        typed = {a.arg: t for a in init.args.args if (t := self._annotated(a)) is not None}
        typed.update(self._init_params.get(id(cls), {}))
        attrs = {}
        for node in ast.walk(init):
            if isinstance(node, ast.Assign) and (kind := self._kind(node.value, typed, {})):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and _is_name(t.value, "self"):
                        attrs[t.attr] = kind
        return attrs

    @staticmethod
    def _annotated(arg: ast.arg) -> type[BaseModel] | None:
        if arg.annotation is None:
            return None
        for node in ast.walk(arg.annotation):
            name = node.id if isinstance(node, ast.Name) else getattr(node, "value", None)
            if isinstance(name, str) and name in CONFIG_TYPES:
                return CONFIG_TYPES[name]
        return None

    def _kind(self, expr, typed, attrs) -> type[BaseModel] | None:
        """The config class ``expr`` evaluates to, or None."""
        if isinstance(expr, ast.Name):
            return typed.get(expr.id)
        if isinstance(expr, ast.Attribute):
            if _is_name(expr.value, "self") and expr.attr in attrs:
                return attrs[expr.attr]
            owner = self._kind(expr.value, typed, attrs)
            if owner not in (None, Field) and expr.attr in owner.model_fields:
                section = _section(owner.model_fields[expr.attr].annotation)
                return section or (Field if self.follow_fields else None)
        return None

    def _body(self, target: Target, typed, attrs) -> None:
        instances: dict[str, Classes] = {}
        for node in ast.walk(target.function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                self._assign(target, node.targets[0], node.value, typed, attrs, instances)
        for node in ast.walk(target.function):
            if isinstance(node, ast.Call):
                self._call(target, node, typed, attrs, instances)

    def _assign(self, target, name, value, typed, attrs, instances) -> None:
        if not isinstance(name, ast.Name):
            return
        if kind := self._kind(value, typed, attrs):
            typed[name.id] = kind
        if not isinstance(value, ast.Call):
            return
        func = value.func
        # x = Class(<config>): an object whose methods hold the config
        if isinstance(func, ast.Name) and any(self._kind(a, typed, attrs) for a in value.args):
            found = self._lookup(target.module, func.id, want_class=True)
            if isinstance(found, tuple):
                instances[name.id] = [found]
        # x = registry.get(...): any class the registry lists
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "get"
            and isinstance(func.value, ast.Name)
        ):
            registry = self._lookup(target.module, func.value.id, want_class=True)
            if isinstance(registry, Module) and registry.registered:
                picked = self.chosen.get(str(registry.path.relative_to(ROOT)))
                names = [picked] if picked else registry.registered
                found = [self._lookup(registry, c, want_class=True) for c in names]
                instances[name.id] = [f for f in found if isinstance(f, tuple)]

    def _call(self, target, node: ast.Call, typed, attrs, instances) -> None:
        passed = [(i, self._kind(a, typed, attrs)) for i, a in enumerate(node.args)]
        passed_kw = [(k.arg, self._kind(k.value, typed, attrs)) for k in node.keywords]
        # **cfg.sections_for(fn): the sections fn names
        spreads = any(
            k.arg is None
            and isinstance(k.value, ast.Call)
            and isinstance(k.value.func, ast.Attribute)
            and k.value.func.attr == "sections_for"
            and self._kind(k.value.func.value, typed, attrs) is schema.Config
            for k in node.keywords
        )
        carried = any(k for _, k in passed) or any(k for _, k in passed_kw) or spreads
        func = node.func
        through = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
        # a method of an object that holds config reaches it through the object
        holds = through and (
            (bool(attrs) and func.value.id == "self") or func.value.id in instances
        )
        if not (carried or holds):
            return
        for callee in self._resolve(func, target, instances):
            params = self._bind(callee, passed, passed_kw)
            if spreads:
                params.update(self._keyword_sections(callee))
            self._visit(callee, params)

    @staticmethod
    def _keyword_sections(callee: Target) -> dict[str, type[BaseModel]]:
        fields = schema.Config.model_fields
        return {
            a.arg: _section(fields[a.arg].annotation)
            for a in callee.function.args.kwonlyargs
            if a.arg in fields
        }

    @staticmethod
    def _bind(callee: Target, passed, passed_kw) -> dict[str, type[BaseModel]]:
        args = [a.arg for a in callee.function.args.args]
        if args and args[0] in ("self", "cls"):
            args = args[1:]
        bound = {args[i]: kind for i, kind in passed if kind is not None and i < len(args)}
        bound.update({name: kind for name, kind in passed_kw if kind is not None and name})
        return bound

    def _resolve(self, func, target: Target, instances) -> list[Target]:
        mod = target.module
        if _is_name(func, "cls") and target.cls is not None:
            init = _method(target.cls, "__init__") or _CLASS_BODY
            return [Target(mod, init, target.cls)]
        if isinstance(func, ast.Name):
            found = self._lookup(mod, func.id)
            return [found] if isinstance(found, Target) else []
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
            return []
        owner = func.value.id
        if owner in ("self", "cls") and target.cls is not None:
            classes = [(mod, target.cls)]
        elif owner in instances:
            classes = instances[owner]
        else:
            found = self._lookup(mod, owner, want_class=True)
            if isinstance(found, Module):
                callee = self._lookup(found, func.attr)
                return [callee] if isinstance(callee, Target) else []
            classes = [found] if isinstance(found, tuple) else []
        return [
            Target(cls_mod, method, cls)
            for cls_mod, cls in classes
            if (method := _method(cls, func.attr)) is not None
        ]

    def _lookup(self, mod: Module, name: str, want_class: bool = False):
        if name in mod.functions:
            return Target(mod, mod.functions[name])
        if name in mod.classes:
            cls = mod.classes[name]
            if want_class:
                return (mod, cls)
            # a dataclass's generated __init__ stands in for the class itself: it holds what it gets
            init = _method(cls, "__init__") or _CLASS_BODY
            return Target(mod, init, cls)
        if name in mod.imports:
            source, attr = mod.imports[name]
            path = module_file(source)
            if path is None:
                return None
            other = load(path)
            if attr is None:
                return other if want_class else None
            return self._lookup(other, attr, want_class)
        return None


# the "function" of a class without an __init__ of its own (a dataclass): nothing to walk
_CLASS_BODY = ast.parse("def __init__(self): pass").body[0]


def _is_name(node, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name
