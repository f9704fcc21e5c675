"""model.init_kwargs: what reaches the policy's from_pretrained, and what the schema refuses."""

from __future__ import annotations

import pytest

from streamrl.configs import ConfigError, load_config
from streamrl.policy.load import load_policy


def test_model_init_kwargs_reach_from_pretrained_and_clashing_keys_are_refused(demo_policy):
    cfg = load_config(None, ["model.init_kwargs={attn_implementation: eager}"], env={})
    eager = load_policy(demo_policy, init_kwargs=cfg.model.init_kwargs)
    assert eager.config._attn_implementation == "eager"
    assert load_policy(demo_policy).config._attn_implementation == "sdpa"
    for key in ("dtype", "torch_dtype", "device_map"):
        with pytest.raises(ConfigError, match=f"model.init_kwargs.*{key} \\(set by"):
            load_config(None, [f"model.init_kwargs={{{key}: auto}}"], env={})
    with pytest.raises(ConfigError, match="trust_remote_code must be true or false"):
        load_config(None, ["model.init_kwargs={trust_remote_code: 'yes'}"], env={})
    # never on by default; on only where named
    assert "trust_remote_code" not in load_config(None, env={}).model.init_kwargs
