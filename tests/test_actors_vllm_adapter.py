"""The vLLM engine's GPU-free parts: arguments, output conversion, version spans, the missing-extra error."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import numpy as np
import pytest

from actors.engines.base import SamplingParams
from actors.engines.vllm import VLLMEngine, VLLMUnavailable, engine_args, sampling_kwargs, to_output
from configs import Config


@dataclass
class Logprob:  # the fields of vllm.logprobs.Logprob that the adapter reads
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # the fields of vllm.outputs.CompletionOutput that the adapter reads
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    weight_versions: list[tuple[int, int]] | None = None


def test_engine_args_ask_for_processed_logprobs_and_native_weight_transfer():
    cfg = Config.model_validate(
        {"actor": {"engine": "vllm", "batch_slots": 128}, "weightsync": {"transport": "dist"}}
    )
    args = engine_args(cfg, seed=7)
    assert args["logprobs_mode"] == "processed_logprobs"
    assert args["weight_transfer_config"] == {"backend": "nccl"}
    assert args["max_num_seqs"] == 128 and args["seed"] == 7 and args["model"] == cfg.model.path


def test_sampling_kwargs_request_the_sampled_tokens_logprob_and_map_top_k_off():
    params = SamplingParams(
        max_new_tokens=9, temperature=0.7, top_p=0.9, top_k=0, stop_token_ids=(1,), stop=("###",)
    )
    kwargs = sampling_kwargs(params)
    assert kwargs["logprobs"] == 0 and kwargs["top_k"] == -1 and kwargs["max_tokens"] == 9
    assert (
        kwargs["stop"] == ["###"]
        and kwargs["stop_token_ids"] == [1]
        and kwargs["include_stop_str_in_output"]
    )
    assert sampling_kwargs(SamplingParams(top_k=20))["top_k"] == 20


def test_a_vllm_completion_converts_with_per_token_versions_from_spans():
    tokens = [5, 6, 7, 8, 1]
    logprobs = [{t: Logprob(-0.1 * (i + 1)), 99: Logprob(-9.0)} for i, t in enumerate(tokens)]
    completion = CompletionOutput(
        0, "", tokens, -1.5, logprobs, "stop", weight_versions=[(0, 3), (3, 4)]
    )
    output = to_output("r0", completion, version_at_start=3)
    assert output.token_ids.tolist() == tokens and output.finish_reason == "stop"
    np.testing.assert_allclose(output.logprobs, [-0.1, -0.2, -0.3, -0.4, -0.5], rtol=1e-6)
    assert output.versions.tolist() == [3, 3, 3, 4, 4]


def test_without_spans_tokens_get_the_version_the_request_started_under():
    completion = CompletionOutput(
        0, "", [5, 6], None, [{5: Logprob(-1.0)}, {6: Logprob(-2.0)}], "length"
    )
    assert to_output("r", completion, version_at_start=2).versions.tolist() == [2, 2]


def test_missing_logprobs_or_bad_spans_are_clear_errors():
    with pytest.raises(ValueError, match="logprobs=0"):
        to_output("r", CompletionOutput(0, "", [5], None, None, "stop"), 0)
    bad = CompletionOutput(
        0, "", [5, 6], None, [{5: Logprob(-1.0)}, {6: Logprob(-1.0)}], "stop", [(0, 2), (1, 1)]
    )
    with pytest.raises(ValueError, match="non-decreasing"):
        to_output("r", bad, 0)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_engine_names_the_extra_to_install():
    with pytest.raises(VLLMUnavailable, match=r"streamrl\[vllm\]"):
        VLLMEngine({"model": "x"})
