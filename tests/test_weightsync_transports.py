"""The weight transports are a registry: the names a config may choose are the registered ones, callers
ask a transport's capabilities instead of comparing its name."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from streamrl.configs.schema import WeightSyncConfig
from streamrl.weightsync import transports

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("actors", "broker", "configs", "launch", "learner", "weightsync")


def test_the_registered_transports_are_exactly_the_schemas_choices():
    choices = get_args(WeightSyncConfig.model_fields["transport"].annotation)
    assert sorted(transports.TRANSPORTS) == sorted(choices)
    assert all(transports.get(name).name == name for name in choices)


def test_an_unknown_transport_is_refused_naming_the_known_ones():
    with pytest.raises(transports.UnknownTransport, match="shm, dist, none"):
        transports.get("pigeon")


def test_only_the_registry_knows_transport_names():
    compares = re.compile(r"transport\s*[!=]=\s*['\"]")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "transports" not in path.relative_to(ROOT).parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if compares.search(line)
    ]
    assert offenders == []


def test_the_capabilities_say_who_publishes_and_who_reads_shared_memory():
    capabilities = {
        name: (t.publishes, t.shared_memory) for name, t in transports.TRANSPORTS.items()
    }
    assert capabilities == {"shm": (True, True), "dist": (True, False), "none": (False, False)}
