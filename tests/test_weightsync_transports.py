"""The weight transports are a registry: the names a config may choose are the registered ones, callers
ask a transport's capabilities instead of comparing its name, importing the registry is cheap, and
a transfer that runs out ``weightsync.timeout_s`` is reported as a timeout by its type."""

from __future__ import annotations

import ast
import time
from pathlib import Path
from typing import get_args

import pytest
from fresh_imports import heavy, modules_after
from weightsync_helpers import with_weightsync
from weightsync_procs import engine_template, learner_tensors

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.configs.schema import WeightSyncConfig
from streamrl.weightsync import transports
from streamrl.weightsync.announce import read_announcement
from streamrl.weightsync.layout import Layout, TensorSpec
from streamrl.weightsync.naming import canonical_tensors
from streamrl.weightsync.publisher import Publisher
from streamrl.weightsync.subscriber import Subscriber
from streamrl.weightsync.transports.base import Transport
from streamrl.weightsync.transports.dist.trust import sign

ROOT = Path(__file__).resolve().parent.parent


def test_the_registered_transports_are_exactly_the_schemas_choices():
    choices = get_args(WeightSyncConfig.model_fields["transport"].annotation)
    assert sorted(transports.TRANSPORTS) == sorted(choices)
    assert all(transports.get(name).name == name for name in choices)


def test_an_unknown_transport_is_refused_naming_the_known_ones():
    with pytest.raises(transports.UnknownTransport, match="shm, cuda_ipc, dist, none"):
        transports.get("pigeon")


def test_the_capabilities_say_who_publishes_reads_shared_memory_and_writes_in_the_background():
    capabilities = {
        name: (t.publishes, t.shared_memory, t.background)
        for name, t in transports.TRANSPORTS.items()
    }
    assert capabilities == {
        "shm": (True, True, True),
        "cuda_ipc": (True, False, False),
        "dist": (True, False, False),
        "none": (False, False, False),
    }


def test_every_transport_declares_every_capability_itself():
    capabilities = {name for name, kind in Transport.__annotations__.items() if "bool" in kind}
    assert len(capabilities) == 4
    for t in transports.TRANSPORTS.values():
        assert capabilities | {"name", "summary", "options"} <= set(vars(type(t))), t.name


# what ``import streamrl.weightsync.transports`` runs: the registry and each transport's package
REGISTRY = ROOT / "weightsync/transports"
REGISTRY_FILES = [
    REGISTRY / "__init__.py",
    REGISTRY / "base.py",
    REGISTRY / "none.py",
    *sorted(REGISTRY.glob("*/__init__.py")),
]


def test_importing_the_registry_imports_no_torch_numpy_or_vllm_and_only_the_registry():
    modules = modules_after("import streamrl.weightsync.transports")
    assert heavy(modules) == set()
    registry = {
        ".".join(("streamrl", *p.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")
        for p in REGISTRY_FILES
    }
    assert {m for m in modules if m.startswith("streamrl.weightsync")} == registry | {
        "streamrl.weightsync"
    }


def test_the_registry_takes_nothing_from_configs_but_its_errors_and_the_section_base():
    """``configs`` may then import the registry without a cycle (both are leaf modules that import
    no other streamrl module); a transport's heavy code is imported inside the factory methods."""
    taken = {}
    for path in REGISTRY_FILES:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                if module.startswith("streamrl.configs"):
                    taken.setdefault(module, []).append(str(path.relative_to(ROOT)))
    assert set(taken) == {"streamrl.configs.errors", "streamrl.configs.section"}, taken


def test_over_none_a_version_is_announced_without_moving_a_byte(redis_cfg):
    ws = WeightSyncConfig(transport="none")
    pub = Publisher.from_config(ws, redis_cfg.broker, redis_cfg.run)
    try:
        stats = pub.publish(3, learner_tensors(3, 16, 1))
        announced = read_announcement(pub.client, pub.keys)
        assert (stats.bytes, stats.transport) == (0, "none")
        assert (announced.version, announced.transport) == (3, "none")
    finally:
        pub.close()


@pytest.mark.slow
def test_a_broadcast_that_never_comes_is_counted_as_a_timeout(redis_cfg):
    cfg = with_weightsync(
        redis_cfg,
        transport="dist",
        timeout_s=1.0,
        dist={"backend": "gloo", "bucket_bytes": 1 << 16},
    )
    ws = cfg.weightsync
    client, keys = connect_sync(cfg.broker, cfg.run.dir), Keys.from_config(cfg.run, cfg.broker)
    tensors, aliases = canonical_tensors(learner_tensors(1, 64, 2))
    layout = Layout.build([TensorSpec.of(name, t) for name, t in tensors.items()])
    sender = transports.get("dist").sender(ws, client, keys, layout)
    sub = Subscriber.from_config(
        cfg.weightsync, cfg.broker, cfg.run, "member", engine_template(64, 2)
    ).start()
    try:
        deadline = time.monotonic() + 20
        while sender.live_members() != ["member"]:
            assert time.monotonic() < deadline, "the subscriber never registered"
            time.sleep(0.05)
        sender.reform(["member"], time.monotonic() + ws.timeout_s)
        assert sender.members == ["member"]
        # the header of version 1, signed as a publish writes it first, and then no broadcast
        header = {
            "version": 1,
            "layout": layout.to_json(),
            "aliases": aliases,
            "bucket_bytes": 1 << 16,
            "publisher": "",
            "checksums": None,
        }
        key = f"e{sender.epoch}/pub/0"
        sender.store.set(key, sign(sender.secret, key, header))
        while "timeout" not in sub.failures:
            assert time.monotonic() < deadline, f"no timeout counted: {sub.failures}"
            time.sleep(0.05)
        assert "error" not in sub.failures and sub.version == 0
        assert sub.last_error.startswith("timeout: TransferTimeout(")
    finally:
        sub.close()
        sender.close()
        client.close()
