"""Source ``environment``: multi-turn trajectories through an environment (``env.name``; docs/multiturn.md).

Each admitted group is G environments reset on its dataset row; model turns and environment
steps alternate (``Rollouts``) until every trajectory of the batch ended. A
trajectory's reward is the reward functions' on the whole conversation plus the environment's
own (part ``env``), or ``env.truncated_reward`` when it ended without the environment saying done.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from streamrl.actors import environment, metrics
from streamrl.actors.admit import Admit
from streamrl.actors.engines.base import Engine, Output, Request, SamplingParams
from streamrl.actors.environment import EnvFailure
from streamrl.actors.group import Group, Sample
from streamrl.actors.rewards import RewardInput, Score
from streamrl.actors.sources.base import Generation, Source
from streamrl.actors.trajectory import Renderer, Trajectory, group_stats
from streamrl.configs.schema import ActorConfig, EnvConfig

log = logging.getLogger(__name__)


class EnvironmentSource(Source):
    name = "environment"

    def __init__(
        self,
        gen: Generation,
        rollouts: Rollouts,
        batch_slots: int,
        truncated_reward: float | None = None,
    ) -> None:
        self.gen = gen
        self.rollouts = rollouts
        self.batch_slots = batch_slots
        self.truncated_reward = truncated_reward

    @classmethod
    def from_config(
        cls, gen: Generation, *, env: EnvConfig, actor: ActorConfig
    ) -> EnvironmentSource:
        factory = environment.load(env.name)
        renderer = Renderer(gen.tokenizer, getattr(factory, "tools", ()), gen.chat_template_kwargs)
        rollouts = Rollouts(env, factory, renderer, gen.assistant_turn)
        return cls(gen, rollouts, actor.batch_slots, env.truncated_reward)

    async def groups(self, admit: Admit) -> AsyncIterator[Group]:
        per_batch = max(1, self.batch_slots // self.gen.group_size)
        while not admit.stopping():
            started = []
            for group in await admit.upto(per_batch):
                trajectories = await self._reset(group, admit)
                if trajectories is not None:
                    started.append((group, trajectories))
            if not started:
                continue
            every = [t for _, trajectories in started for t in trajectories]
            begun = time.monotonic()
            finished = await asyncio.to_thread(
                self.rollouts.run, self.gen.engine, every, self.gen.params, admit.stopping
            )
            self.gen.generated(sum(sum(t.mask) for t in every), begun)
            for group, trajectories in started:
                if finished:
                    yield self._rolled_out(group, trajectories)
                else:
                    await admit.release(group.lease_id)

    async def _reset(self, group: Group, admit: Admit) -> list[Trajectory] | None:
        """The group's G environments reset on its row; None (the group released) if that fails."""
        prompt = group.prompt
        row = {"messages": prompt.messages, "answer": prompt.answer, **prompt.columns}
        try:
            return await asyncio.to_thread(self.rollouts.start_group, row, self.gen.group_size)
        except environment.EnvFailure as exc:
            log.warning("environment reset failed, group %s dropped: %s", prompt.prompt_id, exc)
            await admit.release(group.lease_id)
            return None

    def _rolled_out(self, group: Group, trajectories: list[Trajectory]) -> Group:
        group.prompt_tokens = trajectories[0].prompt
        group.env = group_stats(trajectories)
        group.samples = [self._sample(j, t, group) for j, t in enumerate(trajectories)]
        return group

    def _sample(self, j: int, t: Trajectory, group: Group) -> Sample:
        output = t.output(str(j))
        if t.truncated and self.truncated_reward is not None:
            return Sample(output, None, Score(self.truncated_reward))
        asked = RewardInput(t.messages, group.prompt.answer, group.prompt.columns, True)
        bonus = {"env": sum(t.env_rewards)} if t.env_rewards else {}
        return Sample(output, asked, bonus=bonus)


class Rollouts:
    """Runs a batch of groups of trajectories to their ends, one model turn per engine call."""

    def __init__(
        self, env_cfg: EnvConfig, factory: Callable, renderer: Renderer, assistant_turn
    ) -> None:
        self.cfg = env_cfg
        self.factory = factory
        self.renderer = renderer
        # Output -> the assistant message the environment and rewards see (``Generation.assistant_turn``)
        self.assistant_turn = assistant_turn

    def start_group(self, row: dict, size: int) -> list[Trajectory]:
        """``size`` fresh environments reset on ``row``; the same first messages for all (a group is
        G trajectories from one initial state). EnvFailure if one fails or they differ."""
        timeout = self.cfg.step_timeout_s
        trajectories = []
        first = None
        for _ in range(size):
            env = environment.call(lambda _: self.factory(), None, timeout)
            messages = environment.check_messages(
                environment.call(env.reset, dict(row), timeout), "reset"
            )
            if first is None:
                first = messages
                prompt = self.renderer.prompt(messages)
            elif messages != first:
                raise EnvFailure("invalid", "reset gave different first messages for one row")
            trajectories.append(Trajectory(env, prompt, [dict(m) for m in messages]))
        return trajectories

    def run(
        self,
        engine: Engine,
        trajectories: list[Trajectory],
        params: SamplingParams,
        should_abort: Callable[[], bool] | None = None,
    ) -> bool:
        """Alternate model turns and environment steps until every trajectory ended; False if
        aborted (``should_abort``) before that. The engine keeps an ended trajectory's session no
        longer than the next turn (and none after the return)."""
        try:
            return self._run(engine, trajectories, params, should_abort)
        finally:
            engine.end_sessions(t.session for t in trajectories)

    def _run(self, engine, trajectories, params, should_abort) -> bool:
        room = getattr(engine, "max_positions", None)
        while active := [t for t in trajectories if t.end is None]:
            engine.end_sessions(t.session for t in trajectories if t.end is not None)
            by_budget: dict[int, list[Trajectory]] = {}
            for t in active:
                budget = min(params.max_new_tokens, self.cfg.max_total_tokens - len(t.tokens))
                if room is not None:
                    budget = min(budget, room - len(t.prompt) - len(t.tokens))
                if budget < 1:
                    t.end = "max_total_tokens"
                    continue
                by_budget.setdefault(budget, []).append(t)
            for budget, batch in by_budget.items():
                requests = [
                    Request(str(i), t.prompt + t.tokens, t.session) for i, t in enumerate(batch)
                ]
                outputs = engine.generate(
                    requests, replace(params, max_new_tokens=budget), should_abort
                )
                if any(o.finish_reason == "abort" for o in outputs):
                    return False
                self._after_turns(batch, outputs)
        for t in trajectories:
            metrics.ENV_TURNS.inc(t.turns)
            metrics.ENV_TRAJECTORIES.labels(reason=t.end).inc()
        return True

    def _after_turns(self, batch: list[Trajectory], outputs: list[Output]) -> None:
        """Record each trajectory's model turn, step its environment, and go on or end it."""
        turns = [self._model_turn(t, o) for t, o in zip(batch, outputs, strict=True)]
        steps = self._steps(batch, turns)
        for t, o, step in zip(batch, outputs, steps, strict=True):
            self._after_step(t, o, step)

    def _steps(self, batch: list[Trajectory], turns: list[dict]) -> list:
        """Each trajectory's environment step on its turn (a Step, or the EnvFailure), at most
        ``env.max_concurrent_steps`` at once: a hung step holds one slot, not the batch."""
        workers = min(self.cfg.max_concurrent_steps, len(batch))
        with concurrent.futures.ThreadPoolExecutor(workers, "env-steps") as pool:
            return list(pool.map(self._step, batch, turns))

    def _step(self, t: Trajectory, turn: dict):
        started = time.perf_counter()
        try:
            return environment.check_step(
                environment.call(t.env.step, dict(turn), self.cfg.step_timeout_s),
                len(turn["tool_calls"]),
            )
        except EnvFailure as exc:
            return exc
        finally:
            elapsed = time.perf_counter() - started
            t.steps += 1
            t.step_s += elapsed
            metrics.ENV_STEP_SECONDS.observe(elapsed)

    def _model_turn(self, t: Trajectory, output: Output) -> dict:
        """Record the model's turn; the assistant message its environment steps on."""
        t.add_model_turn(output)
        turn = self.assistant_turn(output)
        turn["tool_calls"] = environment.parse_tool_calls(turn["raw_content"])
        t.tool_calls += len(turn["tool_calls"])
        metrics.ENV_TOOL_CALLS.inc(len(turn["tool_calls"]))
        for _ in range(sum("error" in c for c in turn["tool_calls"])):
            t.tool_failure("parse")
        t.messages.append(turn)
        return turn

    def _after_step(self, t: Trajectory, output: Output, step) -> None:
        if isinstance(step, EnvFailure):
            log.warning("environment step failed, trajectory ends: %s", step)
            if isinstance(step.__cause__, environment.ToolRaised):
                t.tool_failure("raised")
            t.end = step.reason
            return
        for reason in step.tool_failures:
            t.tool_failure(reason)
        if step.reward is not None:
            t.env_rewards.append(float(step.reward))
        if step.done:
            t.end = "done"
            return
        if t.turns >= self.cfg.max_turns:
            t.end = "max_turns"
            return
        try:
            ids = self.renderer.observation(
                step.messages, t.tokens[-1], output.finish_reason == "stop"
            )
        # a tool message the template cannot render is the environment's garbage
        except Exception as exc:
            log.warning("observation not renderable, trajectory ends: %r", exc)
            t.end = "invalid"
            return
        if len(t.tokens) + len(ids) >= self.cfg.max_total_tokens:
            t.end = "max_total_tokens"
            return
        t.add_environment(ids)
        t.messages += [dict(m) for m in step.messages]
