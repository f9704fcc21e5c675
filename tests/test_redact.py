"""No secret leaves a process in a config: the saved run config, `config show` and the trackers
all take ``configs.redact.redacted``; tracker run ids survive a learner restart."""

from __future__ import annotations

import json
import re

import pytest

from streamrl.configs import load_config
from streamrl.configs.redact import MARK, redact_url, redacted
from streamrl.launch.rundir import RUN_ENTRIES
from streamrl.learner.tracking import IDS_FILE, run_ids


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@host:6379/0", f"redis://:{MARK}@host:6379/0"),
        ("rediss://user:s3cret@host:6380/1", f"rediss://user:{MARK}@host:6380/1"),
        ("redis://:p%40ss%3Aword@10.0.0.2:6379/0", f"redis://:{MARK}@10.0.0.2:6379/0"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
    ],
)
def test_a_url_keeps_its_host_and_loses_its_password(url, shown):
    assert redact_url(url) == shown


def test_the_redacted_config_holds_no_secret_from_the_file_overrides_or_redis_url():
    secret, env_secret = "hunter2-file", "hunter2-env"
    cfg = load_config(
        "demo_cpu",
        [f"broker.password={secret}"],
        env={"REDIS_URL": f"redis://:{env_secret}@redis.internal:6379/0"},
    )
    # the process itself keeps them: it needs them
    assert cfg.broker.password == secret and env_secret in cfg.broker.redis_url
    shown = json.dumps(redacted(cfg))
    assert secret not in shown and env_secret not in shown
    tree = redacted(cfg)
    assert tree["broker"]["password"] is None
    assert tree["broker"]["redis_url"] == f"redis://:{MARK}@redis.internal:6379/0"
    # everything else is the config as it is, and the redacted one loads
    assert tree["learner"] == cfg.learner.model_dump(mode="json")
    assert load_config(None, {"broker": tree["broker"]}, env={}).broker.password is None


def test_tracker_run_ids_are_drawn_once_and_kept_with_the_run(tmp_path):
    first = run_ids(tmp_path, "my-run")
    # a learner restart reads them back: one W&B / trackio run across restarts
    assert run_ids(tmp_path, "my-run") == first
    # W&B's id alphabet: lowercase letters and digits
    assert re.fullmatch(r"[a-z0-9]{8,}", first["wandb_id"])
    assert first["trackio_name"].startswith("my-run-")
    # --overwrite removes them with the rest of the run, so a new run gets new ids
    assert IDS_FILE in RUN_ENTRIES
    (tmp_path / IDS_FILE).unlink()
    assert run_ids(tmp_path, "my-run") != first
