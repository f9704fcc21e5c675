"""The agent API served by a vLLM actor: the same agent programs and checks as with the hf engine
(tests/test_agent_api.py), through the same Engine interface. Runs in the vLLM venv
(``make test-vllm``)."""

from __future__ import annotations

import os

import pytest

if not os.environ.get("STREAMRL_REQUIRE_VLLM"):
    pytest.importorskip("vllm", reason="the vLLM CPU build lives in .venv-vllm (make test-vllm)")

from test_agent_api import (  # noqa: E402, F401 - the shared tests run against this module's actor
    policy,
    serving,
    test_a_diverged_conversation_is_refused_and_the_trajectory_kept,
    test_agent_groups_reach_the_stream_token_for_token_with_the_loss_mask,
    test_completions_extend_the_recorded_tokens,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def actor(redis_server, policy, tmp_path_factory):  # noqa: F811
    with serving(redis_server.url, policy, tmp_path_factory.mktemp("agent-run"), "vllm") as a:
        yield a
