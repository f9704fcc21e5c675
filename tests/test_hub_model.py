"""``model.path`` as a hub id, resolved offline from a local hub cache laid out as the hub does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.hub_cache import REVISION, add_to_cache, hub_env

CHILD = textwrap.dedent(
    """
    import json, sys
    import torch
    from streamrl.policy.load import load_policy, load_tokenizer, model_folder
    model = load_policy("org/tiny-demo")
    tokenizer = load_tokenizer("org/tiny-demo")
    ids = torch.tensor([tokenizer.encode("12>")])
    out = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    try:
        model_folder("org/not-cached")
        missing = "resolved"
    except FileNotFoundError as exc:
        missing = str(exc)
    print(json.dumps({
        "folder": model_folder("org/tiny-demo"),
        "pinned": model_folder("org/tiny-demo@" + sys.argv[1]),
        "new_tokens": out.shape[1] - ids.shape[1],
        "first_weight": model.lm_head.weight[0, :4].tolist(),
        "missing": missing,
    }))
    """
)


def test_a_hub_id_loads_from_the_hub_cache_offline(tmp_path, demo_policy):
    from pathlib import Path

    from streamrl.policy.load import load_policy

    snapshot = add_to_cache(tmp_path, "org/tiny-demo", Path(demo_policy))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(hub_env(tmp_path), PYTHONPATH=os.getcwd())
    done = subprocess.run(
        [sys.executable, "-c", CHILD, REVISION],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["folder"] == str(snapshot) and got["pinned"] == str(snapshot)
    assert got["new_tokens"] >= 1
    expected = load_policy(demo_policy).lm_head.weight[0, :4].tolist()
    assert got["first_weight"] == expected
    assert (
        "org/not-cached" in got["missing"]
        and "not a local folder nor in the hub cache" in got["missing"]
    )
    assert "HF_HUB_OFFLINE=1" in got["missing"]


def test_a_missing_local_path_that_is_no_hub_id_is_a_clear_error(tmp_path):
    import pytest

    from streamrl.policy.load import model_folder

    with pytest.raises(FileNotFoundError, match="not a local folder nor a hub id"):
        model_folder(str(tmp_path / "no" / "such" / "folder"))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="is a file"):
        model_folder(tmp_path / "weights.bin")


def test_launch_with_a_model_that_is_neither_a_folder_nor_a_hub_id_exits_2_naming_it_and_builds_nothing(
    tmp_path,
):
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", PYTHONPATH=os.getcwd())
    missing = "org/no-such-model"
    (tmp_path / "d.jsonl").write_text('{"prompt": "1>", "answer": "1"}\n')
    done = subprocess.run(
        [sys.executable, "-m", "streamrl", "run", "--actors", "1", f"run.dir={tmp_path / 'run'}",
         f"model.path={missing}", f"data.path={tmp_path / 'd.jsonl'}",
         "reward.functions=[{fn: exact_match}]"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert missing in done.stderr and "Traceback" not in done.stderr
    assert f"model.path {missing!r} is not a local folder nor in the hub cache" in done.stderr
    assert "HF_HUB_OFFLINE=1" in done.stderr
    # no substitute policy was made where the model was named, and no run directory was begun
    assert not (tmp_path / "org").exists() and not (tmp_path / "run").exists()
