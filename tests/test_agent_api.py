"""An actor serving the OpenAI API (agent.enabled) as its own process against a real Redis, driven
by agent programs written with the `openai` client: their groups land on the stream token for
token as the engine generated them, with the loss mask the learner trains by; the API refuses
callers without the token, diverged conversations and malformed requests, and keeps serving."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import openai
import pytest
import redis
import yaml
from broker_helpers import limits_of

from streamrl.actors.openai_server import load_token
from streamrl.broker.keys import Keys
from streamrl.broker.wire import decode_group
from streamrl.configs import Config
from streamrl.configs.errors import ConfigError
from streamrl.examples.multiturn import hint
from streamrl.learner.batching import collate, samples_from_group
from streamrl.policy.load import load_tokenizer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
ROWS = ["123", "214", "305", "436", "547", "658"]
GROUP = 2
MAX_NEW = 8


def post(url: str, body=None, token: str | None = None) -> tuple[int, dict]:
    """POST ``body`` (bytes as they are, anything else as JSON); the status and the JSON answer."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class Actor:
    def __init__(self, proc, run_dir: Path, redis_url: str, run_name: str, log: Path):
        self.proc, self.log = proc, log
        agent = run_dir / "agent"
        deadline = time.monotonic() + 300
        while not (agent / "a.url").exists():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the actor never served"
            time.sleep(0.2)
        self.base_url = (agent / "a.url").read_text().strip()
        token_file = agent / "a.token"
        assert token_file.stat().st_mode & 0o077 == 0
        self.token = token_file.read_text().strip()
        cfg = Config.model_validate({"run": {"name": run_name}})
        self.keys = Keys.from_config(cfg.run, cfg.broker)
        self.redis = redis.Redis.from_url(redis_url)

    def post(self, url: str, body=None) -> tuple[int, dict]:
        return post(url, body, self.token)

    def open_group(self) -> dict:
        while True:
            status, answer = self.post(f"{self.base_url}/groups", {})
            if status != 503:
                assert status == 200, answer
                return answer
            time.sleep(0.5)

    def client(self, trajectory: dict) -> openai.OpenAI:
        return openai.OpenAI(base_url=trajectory["base_url"], api_key=self.token, max_retries=0)

    def reward(self, trajectory: dict, value) -> dict:
        status, answer = self.post(
            f"{self.base_url}/trajectories/{trajectory['id']}/reward", {"reward": value}
        )
        assert status == 200, answer
        return answer

    def group(self, group_id_count: int):
        """The stream's entries once there are ``group_id_count`` of them, decoded."""
        deadline = time.monotonic() + 60
        while self.redis.xlen(self.keys.stream) < group_id_count:
            assert time.monotonic() < deadline, "the group never reached the stream"
            time.sleep(0.1)
        return [decode_group(f[b"g"]) for _, f in self.redis.xrange(self.keys.stream)]


@pytest.fixture(scope="module")
def policy(multiturn_policy) -> Path:
    return multiturn_policy


@pytest.fixture(scope="module")
def actor(redis_server, policy, tmp_path_factory):
    with serving(redis_server.url, policy, tmp_path_factory.mktemp("agent-run"), "hf") as a:
        yield a


@contextlib.contextmanager
def serving(redis_url: str, policy: Path, tmp: Path, engine: str, **sections: dict):
    """An actor process with ``engine`` serving the API (``sections``: config keys that differ
    from this module's); stopped (and checked) afterwards."""
    data = tmp / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{n}>", "answer": n[::-1]}) + "\n" for n in ROWS)
    )
    run_name = f"agent-{uuid.uuid4().hex[:8]}"
    config = {
        "run": {"name": run_name, "dir": str(tmp / "run")},
        "broker": {"redis_url": redis_url},
        "model": {"path": str(policy)},
        "data": {"path": str(data)},
        "rollout": {"group_size": GROUP, "max_new_tokens": MAX_NEW},
        "reward": {
            "functions": [
                {"fn": "streamrl.examples.reverse_digits:reverse_digits_exact", "name": "exact"}
            ]
        },
        # these agents score some trajectories themselves (and read the task's answer to)
        "agent": {
            "enabled": True,
            "max_total_tokens": 40,
            "max_body_bytes": 4096,
            "trust_reported_reward": True,
        },
        "actor": {"batch_slots": 4, "engine": engine},
        "learner": {"groups_per_step": 16},
        "algo": {"max_staleness": 0},
        "weightsync": {"transport": "none"},
    }
    for section, keys in sections.items():
        config[section].update(keys)
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    log = tmp / "actor.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamrl.actors", "--config", str(tmp / "config.yaml")]
            + ["--actor-id", "a"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        a = Actor(proc, tmp / "run", redis_url, run_name, log)
        yield a
        assert proc.poll() is None, log.read_text()[-3000:]
        # the token never reaches the log
        assert a.token not in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _call(client: openai.OpenAI, messages: list[dict]):
    return client.chat.completions.create(
        model="policy",
        messages=messages,
        max_tokens=MAX_NEW,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )


def _agent(client: openai.OpenAI, task: dict) -> list:
    """An agent program: answers, gets the hint as a user turn, answers again."""
    messages = list(task["messages"])
    first = _call(client, messages)
    attempt = first.choices[0].message.content
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": hint(task["answer"], attempt)},
    ]
    second = _call(client, messages)
    return [first, second]


def test_agent_groups_reach_the_stream_token_for_token_with_the_loss_mask(actor, policy):
    tokenizer = load_tokenizer(str(policy))
    before = actor.redis.xlen(actor.keys.stream)
    group = actor.open_group()
    task = group["task"]
    assert len(group["trajectories"]) == GROUP
    calls = [_agent(actor.client(t), task) for t in group["trajectories"]]
    # one agent reports its reward, the other leaves it to the reward functions
    first = actor.reward(group["trajectories"][0], 0.25)
    assert first["group_complete"] is False
    second = actor.reward(group["trajectories"][1], None)
    assert second["group_complete"] is True and second["published"] is True
    published = actor.group(before + 1)[-1]

    prompt = calls[0][0].model_extra["prompt_token_ids"]
    rendered = tokenizer.apply_chat_template(task["messages"], tokenize=False)
    assert prompt == tokenizer.encode(rendered, add_special_tokens=False)
    assert published.prompt_token_ids.tolist() == prompt
    assert published.meta["row"] == ROWS.index(task["answer"][::-1])
    for (one, two), completion in zip(calls, published.completions, strict=True):
        out1 = one.choices[0].model_extra["token_ids"]
        out2 = two.choices[0].model_extra["token_ids"]
        sent2 = two.model_extra["prompt_token_ids"]
        # the second call continues from the engine's own tokens, never re-encoded
        assert sent2[: len(prompt) + len(out1)] == prompt + out1
        added = sent2[len(prompt) + len(out1) :]
        assert tokenizer.decode(added, skip_special_tokens=False).endswith(
            hint(task["answer"], one.choices[0].message.content)
        )
        assert completion.token_ids.tolist() == out1 + added + out2
        assert completion.loss_mask.tolist() == [1] * len(out1) + [0] * len(added) + [1] * len(out2)
        returned = [e.logprob for c in (one, two) for e in c.choices[0].logprobs.content]
        mask = completion.loss_mask.astype(bool)
        np.testing.assert_array_equal(completion.logprobs[mask], np.float32(returned))
        assert (completion.logprobs[~mask] == 0).all()
    assert published.completions[0].reward == 0.25
    assert published.completions[0].reward_parts == {"agent": 0.25}
    text = calls[1][1].choices[0].message.content
    assert published.completions[1].reward_parts == {"exact": float(text == task["answer"])}
    # the learner trains exactly the model's tokens
    samples = samples_from_group(published, [1.0] * GROUP)
    batch = collate(samples, pad_id=0)
    for i, s in enumerate(samples):
        trained = batch.completion_mask[i, s.prompt_len - 1 : len(s) - 1]
        assert trained.tolist() == published.completions[i].loss_mask.astype(bool).tolist()


def test_completions_extend_the_recorded_tokens(actor):
    before = actor.redis.xlen(actor.keys.stream)
    group = actor.open_group()
    prompt = group["task"]["messages"][0]["content"]
    for t in group["trajectories"]:
        client = actor.client(t)
        first = client.completions.create(
            model="policy", prompt=prompt, extra_body={"return_token_ids": True}
        )
        text = prompt + first.choices[0].text + "<|im_end|>9?9>"
        second = client.completions.create(
            model="policy", prompt=text, extra_body={"return_token_ids": True}
        )
        ids1 = first.choices[0].model_extra["token_ids"]
        assert (
            second.model_extra["prompt_token_ids"][
                : len(first.model_extra["prompt_token_ids"]) + len(ids1)
            ]
            == first.model_extra["prompt_token_ids"] + ids1
        )
        actor.reward(t, 1.0)
    published = actor.group(before + 1)[-1]
    assert all(c.loss_mask is not None and c.loss_mask.sum() > 0 for c in published.completions)


def test_a_diverged_conversation_is_refused_and_the_trajectory_kept(actor):
    group = actor.open_group()
    task = group["task"]
    t = group["trajectories"][0]
    client = actor.client(t)
    reply = _call(client, list(task["messages"])).choices[0].message.content
    edited = list(task["messages"]) + [
        {"role": "assistant", "content": reply + "x"},
        {"role": "user", "content": "again>"},
    ]
    with pytest.raises(openai.ConflictError) as refused:
        _call(client, edited)
    assert refused.value.body["code"] == "conversation_diverged"
    # the same turn sampled again is another trajectory, not a continuation
    with pytest.raises(openai.ConflictError):
        _call(client, list(task["messages"]))
    kept = list(task["messages"]) + [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "again>"},
    ]
    assert _call(client, kept).choices[0].message.role == "assistant"
    for tr in group["trajectories"]:
        if tr is not t:
            _call(actor.client(tr), list(task["messages"]))
        actor.reward(tr, 0.0)
    assert "diverged" in actor.log.read_text()


def test_callers_without_the_token_are_refused(actor):
    assert actor.base_url.startswith("http://127.0.0.1:")
    for key in (None, "", "wrong-token-of-some-length", actor.token[:-1]):
        status, answer = post(f"{actor.base_url}/groups", {}, key)
        assert status == 401 and answer["error"]["code"] == "invalid_api_key"
    client = openai.OpenAI(
        base_url=f"{actor.base_url}/trajectories/x", api_key="wrong", max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="p", messages=[{"role": "user", "content": "1>"}])


def test_malformed_requests_get_4xx_and_the_actor_keeps_serving(actor):
    group = actor.open_group()
    t = group["trajectories"][0]
    url = f"{t['base_url']}/chat/completions"
    good = {"model": "p", "messages": group["task"]["messages"]}
    bad = [
        (b"{not json", 400),
        (b"\xff\xfe{}", 400),
        (b"[" * 4000, 400),
        (json.dumps({"model": "p"}).encode(), 400),
        (json.dumps([1, 2]).encode(), 400),
        (json.dumps({**good, "temperature": 0.3}).encode(), 400),
        (json.dumps({**good, "max_tokens": MAX_NEW + 1}).encode(), 400),
        (json.dumps({**good, "n": 2}).encode(), 400),
        (json.dumps({**good, "stream": True}).encode(), 400),
        (json.dumps({**good, "messages": [{"role": "wizard", "content": "x"}]}).encode(), 400),
        (json.dumps({**good, "messages": [{"role": "user", "content": 5}]}).encode(), 400),
        (json.dumps({**good, "messages": [{"role": "user", "content": "x" * 5000}]}).encode(), 413),
    ]
    for body, status in bad:
        got, answer = actor.post(url, body)
        assert got == status, (body[:80], answer)
        assert answer["error"]["message"]
    assert actor.post(f"{t['base_url']}/completions", {"prompt": [10**6]})[0] == 400
    assert actor.post(f"{actor.base_url}/trajectories/nope/chat/completions", good)[0] == 404
    assert actor.post(f"{t['base_url']}/reward", {"reward": "high"})[0] == 400
    # still serving, and the trajectory untouched by the refusals
    status, answer = actor.post(url, good)
    assert status == 200 and answer["choices"][0]["message"]["role"] == "assistant"
    assert actor.proc.poll() is None
    for tr in group["trajectories"]:
        if tr["id"] != t["id"]:
            assert actor.post(f"{tr['base_url']}/chat/completions", good)[0] == 200
        actor.reward(tr, 0.0)


def test_a_generated_token_is_owner_only_and_a_shared_token_file_is_refused(tmp_path):
    token = load_token(None, str(tmp_path), "a0")
    written = tmp_path / "agent" / "a0.token"
    assert written.read_text().strip() == token and len(token) >= 32
    assert written.stat().st_mode & 0o777 == 0o600
    assert load_token(None, str(tmp_path), "a0") != token
    mine = tmp_path / "mine.token"
    mine.write_text("a-configured-token-0123456789\n")
    mine.chmod(0o600)
    assert load_token(str(mine), str(tmp_path), "a0") == "a-configured-token-0123456789"
    mine.chmod(0o640)
    with pytest.raises(ConfigError, match="readable by others"):
        load_token(str(mine), str(tmp_path), "a0")
    with pytest.raises(ConfigError, match="agent.token_file"):
        load_token(str(tmp_path / "missing"), str(tmp_path), "a0")


@pytest.fixture(scope="module")
def limited(redis_server, policy, tmp_path_factory):
    """An actor with one group in flight at most, a 1 s group timeout and one call at a time."""
    with serving(
        redis_server.url,
        policy,
        tmp_path_factory.mktemp("agent-limited"),
        "hf",
        agent={"group_timeout_s": 1.0, "max_concurrent_requests": 1},
        learner={"groups_per_step": 1},
    ) as a:
        yield a


def test_an_abandoned_group_is_dropped_and_its_admission_slot_freed(limited):
    a = limited
    group = a.open_group()
    assert a.post(f"{a.base_url}/groups", {})[0] == 503
    good = {"model": "p", "messages": group["task"]["messages"]}
    url = f"{group['trajectories'][0]['base_url']}/chat/completions"
    deadline = time.monotonic() + 120
    while a.post(url, good)[0] != 404:
        assert time.monotonic() < deadline, "the abandoned group was never dropped"
        time.sleep(0.2)
    assert "not closed within agent.group_timeout_s" in a.log.read_text()
    assert a.open_group()["group_id"] != group["group_id"]


def test_calls_past_the_concurrency_limit_get_429(limited):
    a = limited
    host, port = a.base_url.removeprefix("http://").split("/")[0].split(":")
    url = f"{a.base_url}/trajectories/none/chat/completions"
    # a call that holds its slot: its body arrives only when the test sends the rest
    held = socket.create_connection((host, int(port)))
    body = json.dumps({"model": "p", "messages": [{"role": "user", "content": "1>"}]}).encode()
    held.sendall(
        b"POST /v1/trajectories/none/chat/completions HTTP/1.1\r\n"
        + f"Host: {host}\r\nAuthorization: Bearer {a.token}\r\n".encode()
        + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body[:5]
    )
    try:
        deadline = time.monotonic() + 60
        while (status := a.post(url, {"model": "p"}))[0] != 429:
            # until the held call has reached the server, this one is served (and not found)
            assert status[0] == 404, status
            assert time.monotonic() < deadline, "the held call never took its slot"
            time.sleep(0.05)
        assert status[1]["error"]["code"] == "too_many_requests"
        held.sendall(body[5:])
        assert held.recv(4096).startswith(b"HTTP/1.1 404")
    finally:
        held.close()
    assert a.post(url, {"model": "p"})[0] == 404


def test_the_learner_bounds_an_agent_trajectory_by_agent_max_total_tokens():
    agent = Config.model_validate(
        {"rollout": {"max_new_tokens": 4}, "agent": {"enabled": True, "max_total_tokens": 40}}
    )
    limits = limits_of(agent)
    assert limits.max_completion_tokens == 40
    assert limits.completion_key == "agent.max_total_tokens"
