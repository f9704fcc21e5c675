"""No secret leaves a process in a config: the saved run config, `config show` and the trackers
all take ``configs.redact.redacted``; tracker run ids survive a learner restart."""

from __future__ import annotations

import json
import re

import pytest

from streamrl.configs import ConfigError, load_config, write_config
from streamrl.configs.redact import (
    MARK,
    SECRETS_ENV,
    redact_text,
    redact_url,
    redacted,
    secret_name,
    secrets_env,
    section_of,
)
from streamrl.configs.schema import Config
from streamrl.launch.rundir import RUN_ENTRIES
from streamrl.learner.tracking import IDS_FILE, run_ids


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@host:6379/0", f"redis://:{MARK}@host:6379/0"),
        ("rediss://user:s3cret@host:6380/1", f"rediss://user:{MARK}@host:6380/1"),
        ("redis://:p%40ss%3Aword@10.0.0.2:6379/0", f"redis://:{MARK}@10.0.0.2:6379/0"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        # a password in the query, an unencoded @ in a password, a bare token as the user part
        ("redis://h/0?password=s3cret&db=1", f"redis://h/0?password={MARK}&db=1"),
        ("redis://:p@ss@host:6379/0", f"redis://:{MARK}@host:6379/0"),
        ("redis://u:a@b@c@h/0?x=1&password=d@e", f"redis://u:{MARK}@h/0?x=1&password={MARK}"),
        ("https://hf_tok3n@huggingface.co/org/data", f"https://{MARK}@huggingface.co/org/data"),
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


SECRETS = ("sk-judge-key", "tok-judge", "pw-query", "tail-after-at", "pw-data", "pw-model", "pw-b")


def _config_with_every_form():
    """A config holding a secret in every form the issue names."""
    return load_config(
        "demo_cpu",
        {
            "reward.functions.0.kwargs": {
                "api_key": SECRETS[0],
                "judge": {"auth_token": SECRETS[1]},
                "temperature": 0.5,
            },
            "broker.redis_url": f"redis://:x@{SECRETS[3]}@redis.internal:6379/0?password={SECRETS[2]}",
            "data.path": f"https://user:{SECRETS[4]}@data.example/prompts.jsonl",
            "model.path": f"https://{SECRETS[5]}@hub.example/org/model",
            "broker.password": SECRETS[6],
            "run.max_steps": 5,
        },
        env={},
    )


def test_no_secret_in_any_form_reaches_the_saved_config_or_config_show_and_the_run_gets_them_back(
    tmp_path,
):
    cfg = _config_with_every_form()
    tree = redacted(cfg)
    shown = json.dumps(tree)
    assert not [s for s in SECRETS if s in shown], shown
    # what is not a secret stays: a judge's temperature, the hosts, the schema's *_key columns
    kwargs = tree["reward"]["functions"][0]["kwargs"]
    assert kwargs == {"api_key": MARK, "judge": {"auth_token": MARK}, "temperature": 0.5}
    assert tree["data"]["path"] == f"https://user:{MARK}@data.example/prompts.jsonl"
    assert tree["data"]["prompt_key"] == cfg.data.prompt_key
    # the saved config (what the children load) holds none; with the run's environment they get
    # every one back, so a judge still gets its key
    saved = write_config(cfg, tmp_path / "config.yaml")
    assert not [s for s in SECRETS if s in saved.read_text()]
    back = load_config(saved, env={SECRETS_ENV: secrets_env(cfg)})
    assert back == cfg
    assert load_config(saved, env={}).reward.functions[0].kwargs["api_key"] == MARK


def test_a_rejected_secret_is_not_shown_in_the_error():
    # a numeric password fails validation; the message names the key, not the value
    with pytest.raises(ConfigError, match="broker.password") as err:
        load_config(None, ["broker.password=8675309"], env={})
    assert "8675309" not in str(err.value)
    with pytest.raises(ConfigError, match="broker.password") as err:
        load_config(None, ["broker.password=[hunter2-unclosed"], env={})
    assert "hunter2" not in str(err.value)
    # a URL's credentials in a message (a log line, an error naming a path)
    line = redact_text("model.path 'https://u:pw-secret@h/m' is not a local folder")
    assert "pw-secret" not in line and "https://u:" in line


def test_every_schema_field_named_like_a_secret_is_declared_one_or_known_not_to_be():
    """A new ``*_token``/``*_key`` knob must say whether it is a secret (``json_schema_extra``)."""
    # names and paths, not secrets (a number under such a name, max_new_tokens, is none either)
    not_secrets = {"password_file", "tls_key_file", "token_file", "prompt_key", "answer_key"}
    named = []

    def walk(model):
        for name, field in model.model_fields.items():
            holds_text = "str" in str(field.annotation)
            if secret_name(name) and holds_text:
                extra = field.json_schema_extra or {}
                if not extra.get("secret") and name not in not_secrets:
                    named.append(f"{model.__name__}.{name}")
            section = section_of(field.annotation)
            if section is not None:
                walk(section)

    walk(Config)
    assert not named, f"declare these secret or add them to not_secrets: {named}"


def test_the_broker_prints_a_url_through_the_one_redaction():
    from streamrl.broker import __main__ as broker_main

    # no second masker of its own
    assert not hasattr(broker_main, "masked") and broker_main.redact_url is redact_url


def test_a_childs_argv_and_the_supervisors_log_lines_hold_no_secret_its_environment_does(
    tmp_path,
):
    from streamrl.launch.supervisor import Child, Supervisor

    cfg = _config_with_every_form().model_copy(deep=True)
    cfg.run.dir = str(tmp_path / "run")
    sup = Supervisor(cfg, actors=1)
    argv = sup._learner_argv()
    child = Child("learner", "learner", argv, tmp_path / "learner.log")
    assert not [s for s in SECRETS if s in " ".join(argv)]
    # the child's environment (its user's only) carries them to its load_config
    assert all(s in sup._env(child)[SECRETS_ENV] for s in SECRETS)
    sup.event("dataset at https://user:pw-in-log@data.example/prompts.jsonl")
    assert "pw-in-log" not in sup.events[-1] and "data.example" in sup.events[-1]


def test_a_url_told_to_other_hosts_keeps_no_credential_in_any_form():
    from streamrl.configs.redact import strip_url

    for url in (
        "redis://:p@ss@h:6379/0?password=p@ss&db=1",
        "rediss://user:p@ss@h:6379/0?auth=p@ss",
        "redis://p@ss@h:6379/0",
    ):
        stripped = strip_url(url)
        assert "p@ss" not in stripped and "ss@" not in stripped, stripped
        assert stripped.startswith(url.split("://")[0] + "://h:6379/0"), stripped
