"""An installed streamrl (a built wheel, not the source tree) carries what it reads at run time."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "streamrl",
    "learner",
    "actors",
    "broker",
    "weightsync",
    "policy",
    "runtime",
    "configs",
    "launch",
    "examples",
)

CHECK = """
import sys
from pathlib import Path
import streamrl.launch.panels as panels
assert Path(panels.__file__).is_relative_to(Path(sys.argv[1])), panels.__file__
assert panels.queries(), "the dashboard has no queries"
assert (panels.DASHBOARD.parent / "live.html").is_file(), "the live view is missing"
# the demo preset's rewards and `streamrl example`'s makers resolve inside the installed package
from streamrl.actors import plugins
from streamrl.configs import load_config
from streamrl.examples.assets_cli import makers
cfg = load_config(Path(sys.argv[1], "streamrl", "configs", "demo_cpu.yaml"), env={})
made = [f"{f.__module__}:{f.__name__}" for f in makers()["demo"].values()]
for ref in [*made, *(spec.fn for spec in cfg.reward.functions)]:
    fn = plugins.load(ref, "demo")
    assert Path(sys.modules[fn.__module__].__file__).is_relative_to(Path(sys.argv[1])), ref
print(panels.DASHBOARD)
"""


@pytest.mark.timeout(240)
def test_a_wheel_installs_one_package_that_ships_the_dashboard_and_the_live_view(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(src)],
        capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    (wheel,) = wheels.glob("streamrl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {name.split("/")[0] for name in names} == {"streamrl", "streamrl-0.1.0.dist-info"}
    assert {
        "streamrl/launch/dashboards/streamrl.json",
        "streamrl/launch/dashboards/live.html",
    } <= names
    assert "streamrl/configs/demo_cpu.yaml" in names
    # the presets' example tasks are packages of their own; the others are folders loaded by path
    assert "streamrl/examples/reverse_digits/assets.py" in names
    # every package folder (one with an __init__.py): setuptools takes only those pyproject lists
    inits = {
        f"streamrl/{init.relative_to(ROOT).as_posix()}"
        for package in PACKAGES[1:]
        for init in (ROOT / package).rglob("__init__.py")
    }
    assert sorted(inits - names) == []
    assert not any(name.startswith("streamrl/examples/copy_task") for name in names)
    entry_points = zipfile.ZipFile(wheel).read("streamrl-0.1.0.dist-info/entry_points.txt").decode()
    assert "streamrl = streamrl.launch.cli:main" in entry_points
    assert "streamrl_shm = streamrl.actors.engines.vllm.plugin:register" in entry_points

    # Import streamrl.launch.panels from the unpacked wheel alone, far from the source tree.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    run = subprocess.run(
        [sys.executable, "-c", CHECK, str(site)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == str(site / "streamrl" / "launch" / "dashboards" / "streamrl.json")
