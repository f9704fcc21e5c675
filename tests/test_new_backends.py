"""A new engine or a new weight transport is one module and its entry in the registry: nothing else.

The test lays the package out in a temporary folder (as ``make mutate`` does), writes one new
module of each kind there, adds each to its registry's import and list, and changes nothing else.
In a fresh interpreter on that copy: the config takes the new backend by name with its own
options (``actor.<name>``, ``weightsync.<name>``) and refuses them while another backend runs,
the configuration reference documents them, the engine is built from its sections and generates,
the publisher derives its transfer dtype from where the engine computes, and a version travels
from a publisher through the new transport into a subscriber's staging copy, byte for byte.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("actors", "broker", "configs", "examples", "launch", "learner", "policy", "runtime")
PACKAGES += ("weightsync",)

# files in a folder: the sender writes each version's tensors, the receiver loads the announced one
TRANSPORT = '''
"""The ``folder`` transport: each version is a file in a folder both sides see."""

from __future__ import annotations

import time

from pydantic import Field

from streamrl.configs.section import Section
from streamrl.weightsync.transports.base import Transport


class Options(Section):
    """Where the versions go (``weightsync.folder``)."""

    path: str = Field("", description="The folder the publisher writes each version into.")


class FolderSender:
    def __init__(self, path):
        self.path = path

    def send(self, version, tensors, aliases, checksums=None):
        import torch

        torch.save(tensors, f"{self.path}/v{version}.pt")
        return {"file": f"{self.path}/v{version}.pt"}

    def close(self):
        pass


class FolderReceiver:
    def step(self, staging):
        import torch

        from streamrl.weightsync.layout import Layout

        ann = staging.wanted()
        if ann is None:
            return 0.2
        start = time.perf_counter()
        fill = staging.begin_fill(Layout.from_json(ann.meta["layout"]), ann.meta["aliases"])
        if fill is None:
            return 0.02
        saved = torch.load(ann.meta["file"])
        for engine_name, published in fill.pairs:
            fill.tensors[engine_name].copy_(saved[published])
        staging.end_fill(ann.version, ann.publisher, time.perf_counter() - start)
        return 0.0

    def close(self):
        pass


class Folder(Transport):
    name = "folder"
    summary = "files in a folder both sides see"
    options = Options
    publishes = True
    shared_memory = False
    device_ipc = False
    background = False

    def sender(self, ws, client, keys, layout, *, publisher="", host_id=""):
        return FolderSender(ws.folder.path)

    def receiver(self, ws, client, keys, actor_id):
        return FolderReceiver()


TRANSPORT = Folder()
'''

# the prompt's last token again and again, at log-prob 0, on the host's GPU when it has one
ENGINE = '''
"""The ``echo`` engine: repeats a prompt's last token."""

from __future__ import annotations

from pydantic import Field

from streamrl.actors.engines.spec import EngineSpec
from streamrl.configs.section import Section


class Options(Section):
    """How many tokens it echoes (``actor.echo``)."""

    repeat: int = Field(2, ge=1, description="Tokens per completion.")


class Echo(EngineSpec):
    name = "echo"
    summary = "echo (repeats the prompt's last token)"
    options = Options
    computes_on = "gpu"
    places_own_threads = False

    @classmethod
    def from_config(cls, parts, *, actor):
        import numpy as np

        from streamrl.actors.engines.base import Engine, Output

        repeat = actor.echo.repeat

        class EchoEngine(Engine):
            version = 0

            def generate(self, requests, params, should_abort=None, refill=None, on_finished=None):
                return [
                    Output(
                        request_id=r.request_id,
                        token_ids=np.full(repeat, r.prompt_token_ids[-1], dtype=np.int32),
                        logprobs=np.zeros(repeat, dtype=np.float32),
                        versions=np.zeros(repeat, dtype=np.int32),
                        finish_reason="length",
                    )
                    for r in requests
                ]

            def maybe_swap_weights(self):
                pass

        return EchoEngine()
'''

CHECK = """
import json, sys, torch
import streamrl
assert streamrl.__file__.startswith(sys.argv[1]), streamrl.__file__
from streamrl.configs import ConfigError, load_config
from streamrl.configs.reference import render

redis_url, folder = sys.argv[2], sys.argv[3]
found = {}
cfg = load_config(None, {
    "run.name": "newbackends", "run.dir": folder, "broker.redis_url": redis_url,
    "actor.engine": "echo", "actor.echo.repeat": 3,
    "weightsync.transport": "folder", "weightsync.folder.path": folder,
}, env={})
found["options"] = [cfg.actor.echo.repeat, cfg.weightsync.folder.path]
for unread in ({"actor.echo.repeat": 3}, {"weightsync.folder.path": folder}):
    try:
        load_config(None, unread, env={})
    except ConfigError as exc:
        found.setdefault("refused", []).append(str(exc).splitlines()[-1])
reference = render()
found["documented"] = [k for k in ("`actor.echo.repeat`", "`weightsync.folder.path`") if k in reference]

from streamrl.actors import engines
from streamrl.actors.engines.base import EngineParts, Request, SamplingParams
from streamrl.weightsync.publisher import transfer_dtype

engine = engines.get("echo").from_config(EngineParts(None, None, 0), actor=cfg.actor)
out = engine.generate([Request("r0", [7, 8, 9])], SamplingParams(max_new_tokens=3))[0]
found["generated"] = out.token_ids.tolist()
found["dtype"] = str(transfer_dtype(cfg.weightsync, cfg.model, cfg.actor))

from streamrl.weightsync.publisher import Publisher
from streamrl.weightsync.subscriber import Subscriber

weights = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3)}
template = {name: torch.zeros_like(t) for name, t in weights.items()}
pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run, torch.float32)
sub = Subscriber.from_config(cfg.weightsync, cfg.broker, cfg.run, "a0", template).start()
try:
    pub.publish(1, weights)
    from weightsync_helpers import wait_staged
    assert wait_staged(sub, 120), sub.failures
    version, tensors = sub.take_staged()
    found["received"] = [version, all(torch.equal(tensors[n], weights[n]) for n in weights)]
finally:
    sub.close()
    pub.close()
print(json.dumps(found))
"""


def _package_copy(dest: Path) -> Path:
    """The packages laid out as their import names (``streamrl/actors/...``)."""
    top = dest / "streamrl"
    shutil.copytree(ROOT / "streamrl", top, ignore=shutil.ignore_patterns("__pycache__"))
    for package in PACKAGES:
        shutil.copytree(ROOT / package, top / package, ignore=shutil.ignore_patterns("__pycache__"))
    return top


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} in {path}"
    path.write_text(text.replace(old, new))


def test_a_new_engine_and_a_new_transport_are_one_module_and_a_registry_entry_each(
    tmp_path, redis_cfg
):
    top = _package_copy(tmp_path)
    (top / "actors/engines/echo.py").write_text(textwrap.dedent(ENGINE))
    (top / "weightsync/transports/folder.py").write_text(textwrap.dedent(TRANSPORT))
    # the registries' only edits: the new module imported beside the others, and listed
    engines, transports = (
        top / "actors/engines/__init__.py",
        top / "weightsync/transports/__init__.py",
    )
    _edit(engines, "import HF\n", "import HF\nfrom streamrl.actors.engines.echo import Echo\n")
    _edit(engines, "(HF, VLLM)", "(HF, VLLM, Echo)")
    _edit(
        transports, "import cuda_ipc, dist, none, shm", "import cuda_ipc, dist, folder, none, shm"
    )
    _edit(transports, "none.TRANSPORT)", "none.TRANSPORT, folder.TRANSPORT)")

    folder = tmp_path / "versions"
    folder.mkdir()
    run = subprocess.run(
        [sys.executable, "-c", CHECK, str(top), redis_cfg.broker.redis_url, str(folder)],
        cwd=tmp_path,
        # the copy first; the suite's helpers after it (they import no streamrl of their own)
        env={
            "PYTHONPATH": f"{tmp_path}:{ROOT / 'tests'}",
            "PATH": "/usr/bin:/bin",
            "OMP_NUM_THREADS": "1",
        },
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["options"] == [3, str(folder)]
    assert found["refused"] == [
        "  actor: Value error, actor.echo.repeat=3 is set, but no actor runs that engine "
        "(actor.engine=hf, actor.engines=None): leave it at its default (2) or choose a setting "
        "that reads it",
        f"  weightsync: Value error, weightsync.folder.path={str(folder)!r} is set, but "
        "weightsync.transport=shm does not read it: leave it at its default ('') or choose a "
        "setting that reads it",
    ]
    assert found["documented"] == ["`actor.echo.repeat`", "`weightsync.folder.path`"]
    assert found["generated"] == [9, 9, 9]
    # where it computes: the host's GPU, in bfloat16, where it has one, else the CPU's float32
    assert found["dtype"] == str(torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    assert found["received"] == [1, True]
