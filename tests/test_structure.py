"""The code's shape, held: where the config goes, who may take all of it, who knows engine names,
and which subsystem may import which.

These read the source (``ast``), never run it: they guard the structure a newcomer relies on to
change one part without reading the rest.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import subprocess
import textwrap
import typing
from pathlib import Path

import pytest
from config_walk import PACKAGES, ROOT, Walk
from fresh_imports import heavy, modules_after

from streamrl.actors import engines, sources
from streamrl.configs.schema import ActorConfig, Config
from streamrl.weightsync import transports

# The functions that may take the whole Config: each process's composition root, where the
# config is read once and each part gets the sections it reads.
PROCESS_ROOTS = {
    "actors/__main__.py": {"_run_here"},
    "actors/loop.py": {"build_actor", "run_actor"},
    # the trainer every objective runs on: policy, engine, checkpoints, step rows, endpoint
    "learner/trainer.py": {"Trainer.__init__"},
    # RL, and rank 0's Redis side of it: stream, admission, publisher
    "learner/grpo.py": {"GRPO.__init__", "rollout_io"},
    "learner/__main__.py": {"start"},
    # streamrl sft / dpo: the dataset, then the trainer
    "learner/supervised.py": {"Supervised.__init__", "train"},
    "broker/__main__.py": {"main"},
}
# the config package itself, and the launcher, which composes every process's command line
CONFIG_HOLDERS = ("configs", "launch")
MAX_ACTOR_CONFIG_FILES = 15


def _modules(packages=PACKAGES):
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path, ast.parse(path.read_text())


def _functions(tree: ast.Module):
    """(qualified name, node) of every function, methods as ``Class.method``."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def _takes_config(fn: ast.FunctionDef) -> bool:
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    for arg in args:
        annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
        if re.fullmatch(r"(\w+\.)*Config( \| None)?", annotation) or arg.arg == "cfg":
            return True
    return False


@pytest.mark.parametrize(
    ("engine", "source"), itertools.product(engines.ENGINES.values(), sources.SOURCES.values())
)
def test_one_actors_config_reaches_at_most_15_files_from_run_actor(engine, source):
    chosen = {
        "actors/engines/__init__.py": engine.__name__,
        "actors/sources/__init__.py": source.__name__,
    }
    walk = Walk(chosen=chosen).start(ROOT / "actors/loop.py", "run_actor", {"cfg": Config})
    files = walk.relative_files()
    assert len(files) <= MAX_ACTOR_CONFIG_FILES, "\n".join(files)
    # the walk does reach the chosen parts (the modules that define them): it is not blind
    assert {_defined_in(engine), _defined_in(source)} <= set(files)


def _defined_in(cls: type) -> str:
    return str(Path(inspect.getfile(cls)).resolve().relative_to(ROOT))


def test_no_signature_outside_the_process_roots_takes_the_whole_config():
    offenders = []
    for path, tree in _modules():
        rel = str(path.relative_to(ROOT))
        if rel.split("/")[0] in CONFIG_HOLDERS:
            continue
        for name, fn in _functions(tree):
            if _takes_config(fn) and name not in PROCESS_ROOTS.get(rel, set()):
                offenders.append(f"{rel}: {name}")
    assert not offenders, "take the sections they read instead:\n" + "\n".join(offenders)


def _own_files(kind: str, name: str) -> tuple[str, ...]:
    """The files of backend ``name`` (``kind``: its registry's folder): its module or subpackage."""
    return (f"{kind}/{name}.py", f"{kind}/{name}/")


def test_no_validator_or_module_outside_a_backends_own_files_compares_its_name():
    """Callers ask an engine's or a transport's capabilities (and the schema composes their
    options), so a new backend never needs an edit elsewhere; a comparison with a backend's name
    (``engine == "hf"``, ``"shm" in (...)``, ``transport != "dist"``) is allowed only in that
    backend's own files. ``none`` is too common a word to look for alone: any comparison of an
    engine or transport with a literal is refused too."""
    backends = {name: _own_files("actors/engines", name) for name in engines.ENGINES}
    backends |= {
        name: _own_files("weightsync/transports", name)
        for name in transports.TRANSPORTS
        if name != "none"
    }
    literal = r"['\"]({})['\"]"
    patterns = {
        name: re.compile(
            rf"[!=]=\s*{literal.format(name)}|{literal.format(name)}\s*[!=]=|"
            rf"{literal.format(name)}\s+(not\s+)?in\s|\bin\s+[(\[{{][^)\]}}]*{literal.format(name)}"
        )
        for name in backends
    }
    by_variable = re.compile(r"(engine|transport)\w*(\.name)?\s*[!=]=\s*['\"]")
    found = []
    for path, tree in _modules():
        rel = str(path.relative_to(ROOT))
        for number, line in enumerate(path.read_text().splitlines(), 1):
            named = [n for n, pattern in patterns.items() if pattern.search(line)]
            if by_variable.search(line):
                named.append("a literal")
            if any(not rel.startswith(backends.get(n, ())) for n in named):
                found.append(f"{rel}:{number}: {line.strip()}")
        # a table keyed by backend names (the old ``ENGINE_PLACEMENT``) is a comparison too
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                members = [k for k in node.keys if k is not None]
            elif isinstance(node, (ast.Set, ast.Tuple, ast.List)):
                members = node.elts
            elif isinstance(node, ast.Subscript):
                members = [node.slice]
            else:
                continue
            for member in members:
                name = member.value if isinstance(member, ast.Constant) else None
                if name in backends and not rel.startswith(backends[name]):
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not found, "ask the backend's capabilities instead:\n" + "\n".join(found)


def test_the_registered_engines_are_the_schemas_choices():
    choices = set(typing.get_args(ActorConfig.model_fields["engine"].annotation))
    assert set(engines.ENGINES) == choices
    assert all(engines.get(name).name == name for name in choices)
    with pytest.raises(engines.UnknownEngine, match="hf, vllm"):
        engines.get("pigeon")


def test_every_source_the_config_can_choose_is_registered():
    chosen = {
        Config.model_validate(overrides).rollout_source
        for overrides in (
            {},
            {"env": {"name": "my_envs:Maze"}},
            {"agent": {"enabled": True}},
        )
    }
    assert chosen == set(sources.SOURCES)


@pytest.mark.parametrize(
    "built", [*engines.ENGINES.values(), *sources.SOURCES.values()], ids=lambda c: c.__name__
)
def test_engines_and_sources_take_only_the_sections_they_name(built):
    """``from_config``'s keyword-only parameters are config sections, each passed by name
    (``Config.sections_for``); nothing else it takes is config."""
    params = inspect.signature(built.from_config).parameters.values()
    named = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    assert named and set(named) <= set(Config.model_fields)
    assert set(Config().sections_for(built.from_config)) == set(named)
    fn = ast.parse(textwrap.dedent(inspect.getsource(built.from_config))).body[0]
    assert not _takes_config(fn)


def _allowed_imports() -> dict[str, set[str]]:
    """Each package's "May import:" line of its docstring."""
    allowed = {}
    for package in PACKAGES:
        doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text())) or ""
        match = re.search(r"May import:(.*?)\.(\s|$)", doc, re.S)
        allowed[package] = set(re.findall(r"``(\w+)``", match.group(1))) if match else None
    return allowed


def test_each_subsystem_imports_only_what_its_docstring_allows():
    allowed = _allowed_imports()
    found = []
    for path, tree in _modules([p for p, may in allowed.items() if may is not None]):
        package = path.relative_to(ROOT).parts[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("streamrl."):
                other = node.module.split(".")[1]
                if other != package and other not in allowed[package]:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {other}")
    assert not found, "\n".join(found)


def test_every_subsystem_says_what_it_owns_and_what_it_may_import():
    for package in ("actors", "broker", "learner", "policy", "runtime", "weightsync"):
        doc = ast.get_docstring(ast.parse(Path(ROOT, package, "__init__.py").read_text()))
        assert doc and "Owns" in doc and "May import:" in doc, package


def _module_name(path: Path) -> str:
    """actors/engines/hf/engine.py -> streamrl.actors.engines.hf.engine (a package: its
    __init__'s name)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["streamrl", *parts])


def _imported_modules(path: Path, tree: ast.Module, known: set[str]) -> set[str]:
    """The streamrl modules ``path`` imports anywhere in it (at the top, under TYPE_CHECKING or
    inside a function: a cycle through a lazy import is still two modules that need each other).
    ``from package import name`` counts as importing the submodule when ``name`` is one."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path.parent)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return found & known


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_inside_a_package():
    """Within each subsystem no two modules import each other, directly or round a circle: the
    package reads top to bottom, and any module can be imported first."""
    modules = {_module_name(path): (path, tree) for path, tree in _modules()}
    found = []
    for package in PACKAGES:
        prefix = f"streamrl.{package}"
        inside = {name for name in modules if name == prefix or name.startswith(prefix + ".")}
        graph = {name: _imported_modules(*modules[name], inside) - {name} for name in inside}
        found += _cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_module_under_configs_passes_450_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "configs").rglob("*.py")}
    assert max(sizes.values()) < 450, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


# What each process does around its own job, once in broker/ and now runtime's: a name broker/
# uses from this table means that job has crept back into the broker.
PROCESS_PLUMBING = {
    "JsonlLog": "step and audit logs",
    "read_jsonl": "step and audit logs",
    "sched_setaffinity": "CPU pinning",
    "CPUS_ENV": "CPU pinning",
    "create_time": "start-up phases",
    "Phases": "start-up phases",
    "start_http_server": "the metrics endpoint",
}


def test_broker_imports_nothing_about_step_logs_cpu_pinning_or_start_up_phases():
    found = []
    for path, tree in _modules(["broker"]):
        rel = path.relative_to(ROOT)
        for node in ast.walk(tree):
            names = [getattr(node, "id", None), getattr(node, "attr", None)]
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names += [alias.name for alias in node.names]
                modules = [*names, getattr(node, "module", None) or ""]
                if any(str(m).startswith("streamrl.runtime") for m in modules):
                    found.append(f"{rel}:{node.lineno} imports streamrl.runtime")
            found += [
                f"{rel}:{node.lineno} uses {name} ({PROCESS_PLUMBING[name]})"
                for name in names
                if name in PROCESS_PLUMBING
            ]
    assert not found, "runtime/ holds these:\n" + "\n".join(found)


# The learner trains every objective on one base: nothing is written twice, and nothing asks
# which objective it is training.
OBJECTIVE_NAMES = {"grpo", "rl", "sft", "dpo"}
# names that hold an objective's name, wherever a comparison or a lookup reads them
OBJECTIVE_HOLDERS = {"kind", "kinds", "objective", "objectives"}
MIN_REPEATED_LINES = 6


def _learner_modules():
    return list(_modules(["learner"]))


def _body_without_docstring(fn: ast.FunctionDef) -> list[ast.stmt]:
    body = fn.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        if isinstance(first.value.value, str):
            body = body[1:]
    return body


def _normalised(fn: ast.FunctionDef, body: list[ast.stmt]) -> str:
    """``body`` as an AST dump in which the function's own names (its parameters and every name
    it binds) are numbered in order of appearance: a copy whose locals were renamed is the same."""
    bound = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    bound |= {
        n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    numbers: dict[str, str] = {}

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.Name:
            if node.id in bound:
                node.id = numbers.setdefault(node.id, f"_{len(numbers)}")
            return node

        def visit_arg(self, node: ast.arg) -> ast.arg:
            node.arg = numbers.setdefault(node.arg, f"_{len(numbers)}")
            return node

    tree = ast.parse(ast.unparse(ast.Module(body=body, type_ignores=[])))
    return ast.dump(Rename().visit(tree))


def test_no_function_body_of_six_lines_or_more_is_written_twice_in_the_learner():
    seen: dict[str, str] = {}
    twice = []
    for path, tree in _learner_modules():
        rel = path.relative_to(ROOT)
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = _body_without_docstring(fn)
            if not body or body[-1].end_lineno - body[0].lineno + 1 < MIN_REPEATED_LINES:
                continue
            where = f"{rel}:{fn.lineno} {fn.name}"
            key = _normalised(fn, body)
            if key in seen:
                twice.append(f"{where} repeats {seen[key]}")
            seen.setdefault(key, where)
    assert not twice, "\n".join(twice)


def test_no_two_learner_modules_define_a_class_or_a_private_helper_of_the_same_name():
    """A public function is named through its module (``checkpoint.save``); a class, or a private
    helper defined twice (two ``_format``s, two ``Progress``es) is one job done in two places."""
    homes: dict[str, list[str]] = {}
    for path, tree in _learner_modules():
        for node in tree.body:
            if isinstance(node, ast.ClassDef) or (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.name.startswith("_")
            ):
                homes.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: where for name, where in homes.items() if len(where) > 1}
    assert not twice, twice


def test_the_learner_sums_figures_over_ranks_in_one_function():
    callers = [
        f"{path.relative_to(ROOT)}:{fn.name}"
        for path, tree in _learner_modules()
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for call in ast.walk(fn)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "all_reduce"
    ]
    assert len(callers) <= 1, callers


def _names_an_objective(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.lower() in OBJECTIVE_NAMES
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return isinstance(name, str) and name.lower() in OBJECTIVE_HOLDERS


def test_the_learner_never_asks_which_objective_it_trains():
    """``kind == "dpo"``, ``kind in KINDS``, ``{"sft": ..., "dpo": ...}[kind]``, ``case "sft":``:
    an objective supplies its batches and its loss instead."""
    found = []
    for path, tree in _learner_modules():
        rel = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
            elif isinstance(node, ast.Dict):
                operands = [k for k in node.keys if k is not None]
            elif isinstance(node, ast.Subscript):
                operands = [node.slice]
            elif isinstance(node, ast.match_case):
                operands = list(ast.walk(node.pattern))
            else:
                continue
            if any(_names_an_objective(o) for o in operands):
                line = node.pattern.lineno if isinstance(node, ast.match_case) else node.lineno
                found.append(f"{rel}:{line}: {ast.unparse(node)[:80]}")
    assert not found, "\n".join(found)


# what configs may take from the other packages: the registries whose backends bring their own
# settings (each light: their options and capabilities, no torch)
CONFIG_REGISTRIES = {"streamrl.actors.engines", "streamrl.weightsync.transports"}


def test_configs_takes_only_the_backend_registries_from_other_packages_and_loads_without_torch():
    taken = set()
    for _, tree in _modules(["configs"]):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("streamrl."):
                if node.module.split(".")[1] != "configs":
                    taken.add(node.module)
    assert taken == CONFIG_REGISTRIES
    # each importable first (the registries then import configs' leaf modules, configs them)
    for first in ("streamrl.configs", *sorted(CONFIG_REGISTRIES)):
        modules = modules_after(
            f"import {first}\nfrom streamrl.configs import load_config\nload_config('demo_cpu')"
        )
        assert heavy(modules) == set(), first


def test_no_weightsync_module_outside_transports_is_named_after_a_transport():
    """A transport's wire and storage code lives in its own subpackage, never in a namesake
    module one folder up."""
    named = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "weightsync").rglob("*.py")
        if "transports" not in path.relative_to(ROOT).parts
        and any(
            path.stem == name or path.stem.startswith(f"{name}_") for name in transports.TRANSPORTS
        )
    ]
    assert named == []


def test_nothing_in_the_repository_reaches_for_the_developers_shared_folder():
    """A user's clone has no ``../shared``: a benchmark that needs the reference loop carries
    its own copy (``bench/yardstick``)."""
    tracked = subprocess.run(
        ["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    found = [
        name
        for name in tracked
        if (ROOT / name).is_file()
        and name != "tests/test_structure.py"
        and re.search(r"\.\./shared|shared/reference", (ROOT / name).read_text(errors="replace"))
    ]
    assert found == []
