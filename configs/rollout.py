"""What an actor rolls out: sampling (``rollout``), multi-turn environments (``env``) and agents on
the OpenAI API (``agent``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from streamrl.configs.section import Section


class RolloutConfig(Section):
    """How completions are sampled."""

    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments of the tokenizer's apply_chat_template wherever a chat template renders (prompts, multi-turn observations, agent calls), e.g. {enable_thinking: false} for Qwen3 (TRL's chat_template_kwargs). {} = none.",
    )

    group_size: int = Field(
        16, ge=1, description="Completions per prompt (G); one stream entry carries one group."
    )
    max_new_tokens: int = Field(256, ge=1, description="Maximum generated tokens per completion.")
    max_prompt_tokens: int = Field(
        2048,
        ge=1,
        description="Longest prompt (tokens) a stream entry may carry; longer entries are dead-lettered.",
    )
    temperature: float = Field(
        1.0, gt=0, description="Sampling temperature; behaviour log-probs are taken after it."
    )
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description='Nucleus sampling threshold (1 = off). The learner scores tokens under the same truncated, renormalised distribution, so the PPO ratio starts at 1 (docs/guarantees.md, "What mu is").',
    )
    top_k: int = Field(
        0,
        ge=0,
        description="Top-k sampling (0 = off), applied before top_p; the learner scores under it too.",
    )
    stop: list[str] = Field(
        default_factory=list, description="Extra stop strings; the tokenizer's EOS always stops."
    )


class EnvConfig(Section):
    """Multi-turn environments (docs/multiturn.md): the actor alternates model turns and environment
    steps, and trains only the model's tokens."""

    name: str | None = Field(
        None,
        description="The environment: `module:Class` or `path/to/file.py:Class` (any callable returning a fresh environment, called once per trajectory). None = single-turn prompt -> completion.",
    )
    max_turns: int = Field(
        4, ge=1, description="Model turns per trajectory; past it the trajectory is truncated."
    )
    max_total_tokens: int = Field(
        1024,
        ge=1,
        description="Tokens after the prompt (model and environment turns together); a turn may generate at most what is left, and past it the trajectory is truncated.",
    )
    step_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Wall-clock limit of one `reset` or `step` call; past it the trajectory ends with reason `timeout` (a `ToolEnvironment`'s tool processes are killed).",
    )
    max_concurrent_steps: int = Field(
        8,
        ge=1,
        description="Environment steps of one turn's trajectories that run at once: G hung steps cost ceil(G / this) x `step_timeout_s`, not G x.",
    )
    truncated_reward: float | None = Field(
        None,
        description="Reward of a trajectory that ended without the environment saying done (limits, or a step that raised, hung or returned garbage). None = score it as it stands (the reward functions on the conversation so far, plus the environment's rewards).",
    )


class AgentConfig(Section):
    """Agents written against the OpenAI API (docs/multiturn.md#agents-on-the-openai-api): the actor
    serves `/v1/.../chat/completions` and `/v1/.../completions` from its engine instead of running
    its own rollouts, records every call token in, token out, and publishes a group once the agent
    has closed its G trajectories."""

    enabled: bool = Field(
        False,
        description="Serve the OpenAI API to agent programs instead of the actor's own prompt -> completion (or `env.name`) loop.",
    )
    host: str = Field(
        "127.0.0.1",
        description="Bind address of the API (loopback unless you expose it on purpose: every caller with the token can spend the actor's engine).",
    )
    port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of the API (0 = a free one). The actor writes its base URL to <run.dir>/agent/<actor id>.url.",
    )
    token_file: str | None = Field(
        None,
        description="File holding the bearer token agents must send (`Authorization: Bearer ...`, the openai client's api_key); refused if group- or world-accessible. None = a fresh random token per actor start, written to <run.dir>/agent/<actor id>.token (mode 0600). The token never appears in argv or logs.",
    )
    max_body_bytes: int = Field(
        1 << 20, ge=1024, description="Largest request body; larger ones get 413."
    )
    max_concurrent_requests: int = Field(
        64,
        ge=1,
        description="Completion requests in flight at once (they are batched into the engine); more get 429.",
    )
    max_total_tokens: int = Field(
        4096,
        ge=1,
        description="Tokens of one trajectory after its prompt (the model's and the agent's messages together); a call may generate at most what is left, and a call with nothing left gets 400. The learner's bound on a completion in agent mode (in place of rollout.max_new_tokens, which bounds one call).",
    )
    group_timeout_s: float = Field(
        600.0,
        gt=0,
        description="A group whose G trajectories are not all closed this long after it was opened is dropped and its admission lease released.",
    )
    trust_reported_reward: bool = Field(
        False,
        description='Take the reward an agent reports (`{"reward": x}`, clipped to `reward_range`) as the trajectory\'s, and hand agents the task\'s `answer`. False = a reported reward is refused (403) and the reward functions score the recorded conversation (`{"reward": null}`): whoever holds the token would otherwise decide what is trained.',
    )
    reward_range: tuple[float, float] = Field(
        (0.0, 1.0),
        description="[low, high] an agent-reported reward is clipped to (with `trust_reported_reward`); also its part `agent`'s range at the learner.",
    )
    max_connections: int = Field(
        256,
        ge=1,
        description="Open connections to the API at once; more are closed as they arrive.",
    )

    @field_validator("reward_range")
    @classmethod
    def _low_to_high(cls, value):
        if not value[0] <= value[1]:
            raise ValueError(f"reward_range {list(value)}: low is above high")
        return value
