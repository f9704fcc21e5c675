"""Every error streamrl raises on purpose derives from StreamRLError and keeps its builtin base."""

import pytest

from streamrl.actors.engines.spec import EngineUnavailable
from streamrl.actors.engines.vllm.push import EngineFailed, PushFailed
from streamrl.actors.prompt_data import PromptDataError
from streamrl.broker.client import RedisNotConfigured
from streamrl.broker.server import RedisServerError
from streamrl.broker.wire import WireError, decode_group
from streamrl.configs import ConfigError, StreamRLError, load_config
from streamrl.launch.prometheus import PrometheusError
from streamrl.weightsync.naming import NameMappingError

BUILTIN_BASE = {
    ConfigError: ValueError,
    PromptDataError: ValueError,
    WireError: ValueError,
    NameMappingError: ValueError,
    RedisNotConfigured: RuntimeError,
    RedisServerError: RuntimeError,
    PrometheusError: RuntimeError,
    PushFailed: RuntimeError,
    EngineFailed: RuntimeError,
    EngineUnavailable: ImportError,
}


@pytest.mark.parametrize("error", list(BUILTIN_BASE), ids=lambda e: e.__name__)
def test_error_derives_from_streamrl_error_and_its_builtin(error):
    assert issubclass(error, StreamRLError)
    assert issubclass(error, BUILTIN_BASE[error])


def test_one_except_catches_a_bad_config_and_a_bad_entry(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("learner: {lr: -1}\n")
    caught = []
    for fail in (lambda: load_config(bad), lambda: decode_group(b"\x00not msgpack")):
        try:
            fail()
        except StreamRLError as exc:
            caught.append(type(exc))
    assert caught == [ConfigError, WireError]
