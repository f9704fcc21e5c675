"""The agent API does not let a token holder decide what is trained: reported rewards only where
trusted (and clipped), prompts tied to the admitted row, one publication however many closes
race, text bounded before templating, and a cap on open connections. One in-process server on
the demo policy's real engine and tokenizer; ``admit``/``publish`` are the actor's callbacks,
here recording what the server hands over."""

from __future__ import annotations

import asyncio
import json

import pytest

from streamrl.actors.engines.base import SamplingParams
from streamrl.actors.engines.hf.engine import HFEngine
from streamrl.actors.group import Group
from streamrl.actors.openai_server import AgentServer, Handlers
from streamrl.actors.prompt_data import Prompt
from streamrl.actors.sources.base import Generation
from streamrl.configs.schema import AgentConfig
from streamrl.policy.load import load_policy, load_tokenizer

GROUP = 2
ROW = [{"role": "user", "content": "123>"}]


@pytest.fixture(scope="module")
def generation(demo_policy) -> Generation:
    tokenizer = load_tokenizer(demo_policy)
    engine = HFEngine(load_policy(demo_policy), tokenizer, batch_slots=4, seed=0)
    params = SamplingParams(max_new_tokens=4, stop_token_ids=(tokenizer.eos_token_id,))
    return Generation(engine, "a", params, tokenizer, GROUP)


class Agents:
    """A served API and what it handed to the actor."""

    def __init__(self, generation: Generation, tmp_path, **agent) -> None:
        self.published: list = []
        self.handlers = Handlers(self._admit, self._publish, self._release, lambda: False)
        self.server = AgentServer(
            AgentConfig(enabled=True, max_total_tokens=16, **agent),
            generation,
            self.handlers,
            actor_id="a",
            run_dir=str(tmp_path),
            model_path="policy",
            max_prompt_tokens=16,
        )

    async def _admit(self):
        return Group("lease", Prompt(0, 0, [], ROW, "321"))

    async def _publish(self, group) -> bool:
        # the actor scores and publishes: other closes run meanwhile
        await asyncio.sleep(0.01)
        self.published.append(group)
        return True

    async def _release(self, lease_id: str) -> None:
        pass

    def address(self) -> tuple[str, int]:
        host, port = self.server.base_url.split("//")[1].split("/")[0].rsplit(":", 1)
        return host, int(port)

    async def request(self, method: str, path: str, body=None, split: bool = False):
        """The status and JSON answer of one request on its own connection; ``split``: return
        a coroutine that sends the body and reads the answer, after only the head was sent."""
        host, port = self.address()
        reader, writer = await asyncio.open_connection(host, port)
        data = json.dumps(body).encode() if body is not None else b""
        head = (
            f"{method} /v1{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
            f"Authorization: Bearer {self.server.token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        ).encode()
        writer.write(head)
        await writer.drain()

        async def finish():
            writer.write(data)
            await writer.drain()
            answer = await reader.read()
            writer.close()
            if not answer:
                return None, None
            status = int(answer.split(b" ", 2)[1])
            return status, json.loads(answer.split(b"\r\n\r\n", 1)[1] or b"null")

        return finish() if split else await finish()


def _serve(generation, tmp_path, scenario, **agent):
    async def main():
        agents = Agents(generation, tmp_path, **agent)
        await agents.server.start()
        try:
            return await scenario(agents)
        finally:
            await agents.server.close()

    return asyncio.run(main())


def test_racing_closes_of_the_last_trajectory_publish_the_group_once(generation, tmp_path):
    async def scenario(agents):
        _, group = await agents.request("POST", "/groups", {})
        first, last = (t["id"] for t in group["trajectories"])
        assert (await agents.request("POST", f"/trajectories/{first}/reward", {"reward": None}))[
            0
        ] == 200
        # every close has been routed and waits for its body before any closes
        pending = [
            await agents.request("POST", f"/trajectories/{last}/reward", {"reward": None}, True)
            for _ in range(50)
        ]
        answers = await asyncio.gather(*pending)
        assert sorted({status for status, _ in answers}) == [200, 409]
        assert sum(a["published"] for s, a in answers if s == 200) == 1
        return agents.published

    assert len(_serve(generation, tmp_path, scenario)) == 1


def test_reported_rewards_need_trust_and_are_clipped(generation, tmp_path):
    async def untrusted(agents):
        _, group = await agents.request("POST", "/groups", {})
        assert "answer" not in group["task"]
        tid = group["trajectories"][0]["id"]
        status, answer = await agents.request("POST", f"/trajectories/{tid}/reward", {"reward": 1})
        assert status == 403 and answer["error"]["code"] == "reward_not_trusted"

    _serve(generation, tmp_path, untrusted)

    async def trusted(agents):
        _, group = await agents.request("POST", "/groups", {})
        assert group["task"]["answer"] == "321"
        for t, reward in zip(group["trajectories"], (1e6, -3.0), strict=True):
            await agents.request("POST", f"/trajectories/{t['id']}/reward", {"reward": reward})
        return [t.reward for t in agents.published[0].trajectories]

    rewards = _serve(generation, tmp_path, trusted, trust_reported_reward=True)
    assert rewards == [1.0, 0.0]


def test_the_first_prompt_must_hold_the_admitted_row(generation, tmp_path):
    async def scenario(agents):
        _, group = await agents.request("POST", "/groups", {})
        url = f"/trajectories/{group['trajectories'][0]['id']}/completions"
        status, answer = await agents.request("POST", url, {"prompt": "999>"})
        assert status == 400 and "task's prompt" in answer["error"]["message"]
        status, answer = await agents.request("POST", url, {"prompt": "123>"})
        assert status == 200, answer

    _serve(generation, tmp_path, scenario)


def test_text_past_the_room_is_refused_before_templating(generation, tmp_path):
    async def scenario(agents):
        _, group = await agents.request("POST", "/groups", {})
        url = f"/trajectories/{group['trajectories'][0]['id']}"
        long = "7" * 200_000
        status, answer = await agents.request("POST", f"{url}/completions", {"prompt": long})
        assert status == 400 and "characters" in answer["error"]["message"]
        messages = [*ROW, {"role": "user", "content": long}]
        status, answer = await agents.request(
            "POST", f"{url}/chat/completions", {"messages": messages}
        )
        assert status == 400 and "characters" in answer["error"]["message"]

    _serve(generation, tmp_path, scenario, max_body_bytes=1 << 20)


def test_connections_past_the_cap_are_closed(generation, tmp_path):
    async def scenario(agents):
        host, port = agents.address()
        idle = [await asyncio.open_connection(host, port) for _ in range(10)]
        reads = {asyncio.ensure_future(reader.read()): writer for reader, writer in idle}
        # the server closes each connection it accepts while 4 are open (a bound on failure only)
        closed: set = set()
        while len(closed) < 6:
            done, _ = await asyncio.wait(
                set(reads) - closed, timeout=60, return_when=asyncio.FIRST_COMPLETED
            )
            assert done, f"{len(closed)} connections closed, 6 expected"
            closed |= done
        assert all(read.result() == b"" for read in closed)
        for read, writer in reads.items():
            if read not in closed:
                writer.write(
                    f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
                    f"Authorization: Bearer {agents.server.token}\r\n\r\n".encode()
                )
        opened = [read for read in reads if read not in closed]
        return [(await read).split(b" ", 2)[1] for read in opened]

    assert _serve(generation, tmp_path, scenario, max_connections=4) == [b"200"] * 4
