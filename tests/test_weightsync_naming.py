"""Name mapping, flat layout, bucket plans and vLLM version spans: the pure parts of weightsync."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.actors.engines.vllm.outputs import token_versions
from streamrl.actors.engines.vllm.senders import plan_buckets
from streamrl.weightsync.layout import Layout, TensorSpec
from streamrl.weightsync.naming import (
    NameMappingError,
    canonical_tensors,
    map_to_template,
    strip_wrappers,
)
from streamrl.weightsync.transports.dist.buckets import windows


def _tied_model():
    from streamrl.examples.reverse_digits.task import build_model

    return build_model(vocab_size=40, eos_id=1, pad_id=0)


def test_wrapper_prefixes_are_stripped_however_nested():
    assert (
        strip_wrappers("module._orig_mod.model.layers.0.mlp.up_proj.weight")
        == "model.layers.0.mlp.up_proj.weight"
    )
    assert strip_wrappers("model.module_list.weight") == "model.module_list.weight"


def test_tied_lm_head_is_sent_once_and_becomes_an_alias():
    model = _tied_model()
    state = {"module." + k: v for k, v in model.state_dict().items()}
    tensors, aliases = canonical_tensors(state)
    assert "lm_head.weight" not in tensors
    assert aliases == {"lm_head.weight": "model.embed_tokens.weight"}


def test_deepspeed_state_dict_maps_onto_engine_named_parameters_and_state_dict():
    model = _tied_model()
    tensors, aliases = canonical_tensors({"module." + k: v for k, v in model.named_parameters()})
    published = {k: tuple(v.shape) for k, v in tensors.items()}
    for template in (dict(model.named_parameters()), model.state_dict()):
        pairs = map_to_template(published, aliases, template)
        # tied storage filled by one copy
        assert len(pairs) == len(tensors)


def test_missing_extra_and_mismatched_names_fail_loudly_with_every_name():
    template = {"a": torch.zeros(2), "b": torch.zeros(3), "c": torch.zeros(4)}
    published = {"a": (2,), "b": (5,), "z": (1,)}
    with pytest.raises(NameMappingError) as err:
        map_to_template(published, {}, template)
    message = str(err.value)
    assert "missing" in message and "'c'" in message
    assert "extra" in message and "'z'" in message
    assert "shape mismatch" in message and "b: engine (3,)" in message


def test_untied_engine_without_published_lm_head_is_an_error():
    embed = torch.zeros(4, 2)
    template = {"model.embed_tokens.weight": embed, "lm_head.weight": torch.zeros(4, 2)}
    with pytest.raises(NameMappingError, match="lm_head.weight"):
        map_to_template({"model.embed_tokens.weight": (4, 2)}, {}, template)


def test_two_learner_names_colliding_after_stripping_are_rejected():
    with pytest.raises(NameMappingError, match="two learner tensors"):
        canonical_tensors({"module.w": torch.zeros(1), "w": torch.zeros(1)})


def test_layout_views_round_trip_every_dtype_without_copies():
    specs = [
        TensorSpec("a", (3, 5), "float32"),
        TensorSpec("b", (7,), "bfloat16"),
        TensorSpec("c", (), "int64"),
    ]
    layout = Layout.build(specs)
    assert all(off % 64 == 0 for off in layout.offsets)
    buffer = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    views = layout.views(buffer)
    views["a"].fill_(1.5)
    views["b"].fill_(-2)
    views["c"].fill_(7)
    again = Layout.from_json(layout.to_json()).views(buffer)
    assert again["a"].sum() == 22.5 and again["b"].sum() == -14 and int(again["c"]) == 7


def test_malformed_layout_json_is_a_clear_error():
    with pytest.raises(ValueError, match="malformed weight layout"):
        Layout.from_json([["a", "not-a-shape", "float32"]])
    with pytest.raises(ValueError, match="unknown dtype"):
        _ = TensorSpec("a", (1,), "float99").nbytes


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=12), st.integers(1, 700))
def test_bucket_windows_cover_every_tensor_byte_exactly_once(sizes, bucket_bytes):
    layout = Layout.build([TensorSpec(f"t{i}", (n,), "uint8") for i, n in enumerate(sizes)])
    covered = {f"t{i}": np.zeros(n, dtype=int) for i, n in enumerate(sizes)}
    for index, window in enumerate(windows(layout, bucket_bytes)):
        for name, start, end, at in window:
            covered[name][start:end] += 1
            assert 0 <= at and at + end - start <= bucket_bytes
            assert index * bucket_bytes + at == layout.offsets[int(name[1:])] + start
    assert all((c == 1).all() for c in covered.values())


def test_vllm_buckets_keep_order_and_respect_the_size():
    specs = [TensorSpec(f"w{i}", (n,), "float32") for i, n in enumerate([10, 10, 30, 5, 5])]
    buckets = plan_buckets(specs, 80)
    assert [[s.name for s in b.specs] for b in buckets] == [["w0", "w1"], ["w2"], ["w3", "w4"]]
    assert buckets[0].update_info() == {
        "names": ["w0", "w1"],
        "dtype_names": ["float32", "float32"],
        "shapes": [[10], [10]],
    }


def test_vllm_version_spans_become_per_token_versions():
    assert token_versions([(0, 4), (3, 6)], 5).tolist() == [4, 4, 4, 6, 6]
    assert token_versions([(0, 2)], 3).tolist() == [2, 2, 2]
    assert token_versions([], 0).tolist() == []
    for bad in ([(1, 4)], [(0, 5), (2, 4)], [(0, 1), (9, 2)]):
        with pytest.raises(ValueError):
            token_versions(bad, 5)
