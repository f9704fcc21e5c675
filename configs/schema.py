"""The config schema. Every knob is documented here, once, with its default.

Sections follow the data path: rollout/actor -> broker -> learner/algo ->
weightsync -> back to the actors. Unknown keys are errors (``extra="forbid"``)
so a typo fails at start instead of silently doing nothing.
"""

from __future__ import annotations

import inspect
import socket
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def _takes_list(annotation) -> bool:
    """Whether a field's type is a list (``list[X]`` or ``list[X] | None``)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_takes_list(a) for a in typing.get_args(annotation))
    return typing.get_origin(annotation) is list


def _literal_allows(annotation, value) -> bool:
    """Whether a ``Literal`` arm of the field's type takes ``value`` as it is (``actor.gpus``'s
    ``"share"`` stays a string)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_literal_allows(a, value) for a in typing.get_args(annotation))
    return typing.get_origin(annotation) is typing.Literal and value in typing.get_args(annotation)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _scalar_to_list(cls, data):
        """One value where a list is expected is a list of one, as TRL reads
        ``--report_to wandb``: ``run.report_to=wandb`` is ``[wandb]``."""
        if not isinstance(data, dict):
            return data
        return {
            key: [value]
            if key in cls.model_fields
            and isinstance(value, (str, int, float, dict))
            and _takes_list(cls.model_fields[key].annotation)
            and not _literal_allows(cls.model_fields[key].annotation, value)
            else value
            for key, value in data.items()
        }


class RunConfig(Section):
    """One run: its name, directory, seed and end."""

    name: str = Field(
        "streamrl",
        description="Run name; also the Redis key prefix, so several runs can share one Redis.",
    )
    dir: str | None = Field(
        None,
        description="Run directory: logs, checkpoints, scrape config, the Redis data dir. None = `runs/<run.name>`.",
    )
    seed: int = Field(0, description="Seed for prompt order, sampling and initialisation.")
    max_steps: int = Field(
        0, ge=0, description="Stop after this many learner steps (0 = no limit)."
    )
    max_time_s: float = Field(
        0.0, ge=0, description="Stop after this many seconds of wall time (0 = no limit)."
    )
    torch_threads: int = Field(
        1,
        ge=1,
        description="torch threads per process; 2 threads on 2 shared cores ran 35x slower.",
    )
    target_reward: float = Field(
        0.0,
        ge=0,
        description="Stop once the mean reward of the last `target_window` learner steps reaches this (0 = no reward bar).",
    )
    target_parts: dict[str, float] = Field(
        default_factory=dict,
        description="Stop once the means of these reward parts over the last `target_window` steps reach their bars, e.g. `{reverse_digits_exact: 0.85}`; a part is named after its reward function (its `name`, else `fn`; `fn/key` for a function returning a dict). Every bar set, `target_reward` included, must hold; a bar of 0 is no bar.",
    )
    target_window: int = Field(
        20,
        ge=1,
        description="Learner steps averaged for the target (the reference loop's 20-rollout mean).",
    )
    report_to: list[Literal["tensorboard", "wandb", "trackio"]] = Field(
        default_factory=lambda: ["tensorboard"],
        description="Experiment trackers that get every scalar of the learner's step rows (TensorBoard event files under <run.dir>/tensorboard; wandb and trackio are extras).",
    )
    log_samples_every: int = Field(
        10, ge=0, description="Log a table of sample completions every N learner steps (0 = off)."
    )
    log_samples: int = Field(4, ge=1, description="Sample completions per logged table.")
    shared_read: bool = Field(
        False,
        description="Let other local users read what the run writes (logs, step rows, checkpoints, TensorBoard files, the run directory): new files 0644 and directories 0755 instead of 0600/0700. Never writable by others.",
    )
    export_at_end: bool = Field(
        True,
        description="When the learner stops, write the policy as a Hugging Face folder (safetensors, config, tokenizer) to <run.dir>/policy.",
    )
    host_id: str = Field(
        "",
        pattern=r"^[A-Za-z0-9_.\-]*$",
        validate_default=True,
        # a property of the process, not of the run: a saved run config read on another host
        # must not make that host pose as this one
        exclude=True,
        description="This host's identity; '' = its hostname. Everything host-local is keyed by it: the weight announcements and shared-memory segment its actors read, run-dir files, the metrics' host label. Every host of a run needs a distinct one. Never saved with the run's config.",
    )

    @field_validator("name")
    @classmethod
    def _name_is_one_path_part(cls, name: str) -> str:
        # the default run.dir is runs/<name>: `..` would make it the working directory
        if name in ("", ".", "..") or "/" in name or "\\" in name:
            raise ValueError("must be a plain name: not empty, `.`, `..` or a path with / or \\")
        return name

    @field_validator("host_id")
    @classmethod
    def _hostname(cls, value: str) -> str:
        return value or socket.gethostname()

    @model_validator(mode="before")
    @classmethod
    def _dir_from_name(cls, data):
        # before validation, so the derived directory is a set value like any other
        if isinstance(data, dict) and data.get("dir") is None:
            name = data.get("name", cls.model_fields["name"].default)
            data = {**data, "dir": f"runs/{name}"}
        return data


class BrokerConfig(Section):
    """Redis: the embedded server or an external one, the rollout stream and its consumer group."""

    redis_url: str | None = Field(
        None,
        description="External Redis URL (redis://[:password@]host:port/db). Overridden by the REDIS_URL environment variable. None = start the embedded server.",
    )
    host: str = Field(
        "127.0.0.1",
        description="Bind address of the embedded Redis. Non-loopback requires `password`.",
    )
    port: int = Field(
        0, ge=0, le=65535, description="Port of the embedded Redis (0 = pick a free one)."
    )
    password: str | None = Field(
        None,
        json_schema_extra={"secret": True},
        description="requirepass for the embedded Redis (None = a random one per run, kept in the 0600 URL file); mandatory for a non-loopback bind. `streamrl broker` and `streamrl actors --join` refuse it on the command line (visible in `ps`): they read STREAMRL_REDIS_PASSWORD, else `password_file`.",
    )
    password_file: str | None = Field(
        None,
        description="File holding the Redis password on its first line, for `streamrl broker` and `streamrl actors --join` when STREAMRL_REDIS_PASSWORD is unset; refused unless only its owner may read it (mode 0600 or stricter).",
    )
    tls_cert_file: str | None = Field(
        None,
        description="`streamrl broker`: PEM certificate of the embedded Redis; with `tls_key_file` it serves TLS only (rediss://) on `port`. None = plain TCP.",
    )
    tls_key_file: str | None = Field(
        None, description="`streamrl broker`: PEM private key of `tls_cert_file`."
    )
    tls_ca_file: str | None = Field(
        None,
        description="PEM CA bundle clients verify the broker's certificate with; `streamrl broker` puts it in the URL it prints (`?ssl_ca_certs=`). None = the system's CAs.",
    )
    appendonly: bool = Field(
        False,
        description="AOF persistence for the embedded Redis, so a restarted Redis keeps the stream, pending lists and counters.",
    )
    appendfsync: Literal["everysec", "always"] = Field(
        "everysec",
        description="AOF fsync policy. A killed redis-server loses nothing either way (the AOF is written before replies); on a machine crash everysec loses up to ~1 s of acknowledged entries, always none (slower writes).",
    )
    maxmemory_mb: int = Field(
        4096,
        ge=16,
        description="maxmemory of the embedded Redis, with policy noeviction: when full, writes (an actor's publish) fail with Redis's OOM error and nothing already in the stream is evicted; reads and acks (which free memory) go on. Size it above broker.maxlen x a group's entry size.",
    )
    client_output_buffer_mb: int = Field(
        256,
        ge=1,
        description="Hard output-buffer limit for normal clients of the embedded Redis: a client whose unread replies pass it is disconnected (a local user flooding commands without reading, even unauthenticated). Must exceed the largest read: learner.groups_per_step x a group's entry size.",
    )
    stream: str = Field(
        "rollouts",
        description="Stream name (under the run prefix) that carries scored rollout groups.",
    )
    dead_letter_stream: str = Field(
        "rollouts:dead",
        description="Stream (under the run prefix) that receives undecodable entries with the reason.",
    )
    consumer_group: str = Field("learner", description="Redis consumer group of the learner ranks.")
    maxlen: int = Field(
        100_000,
        ge=1,
        description="Safety cap on the stream length (approximate MAXLEN); trims are counted. Real backpressure is admission control.",
    )
    block_ms: int = Field(
        1000,
        ge=1,
        description="XREADGROUP BLOCK in milliseconds; must stay below socket_timeout_s.",
    )
    socket_timeout_s: float = Field(
        10.0, gt=0, description="redis-py socket timeout for every command."
    )
    claim_idle_ms: int = Field(
        30_000,
        ge=1,
        description="Entries pending on a consumer idle for longer are taken over with XAUTOCLAIM.",
    )
    max_entry_bytes: int = Field(
        64 << 20,
        ge=1024,
        description="Decoder size limit for one stream entry; larger entries are dead-lettered.",
    )
    max_abs_reward: float = Field(
        100.0,
        gt=0,
        description="The range [-x, x] of a reward function that declares none (`reward.functions[].range`, built-ins' own) and of an environment's reward (part `env`); an entry whose reward or part lies outside its range is dead-lettered (a hostile peer could otherwise move the target or overflow advantages).",
    )
    max_deliveries: int = Field(
        5,
        ge=1,
        description="An entry delivered this many times without being trained (e.g. training raised on it before every restart) is dead-lettered.",
    )
    dead_letter_payload_bytes: int = Field(
        4096,
        ge=0,
        description="Bytes of a dead-lettered payload kept (with its full size and sha256); bounds the dead-letter stream to ~10,000 x this.",
    )
    retries: int = Field(
        10,
        ge=0,
        description="Retries of a failed Redis command (jittered exponential backoff) before the error surfaces.",
    )
    health_check_interval_s: int = Field(
        30,
        ge=0,
        description="redis-py pings a connection idle for longer before reusing it (0 = off).",
    )
    lease_ttl_s: float = Field(
        120.0,
        gt=0,
        description="Admission lease of an in-flight group expires after this long, so a killed actor frees its slots.",
    )

    @model_validator(mode="after")
    def _block_below_timeout(self) -> BrokerConfig:
        if self.block_ms / 1000.0 >= self.socket_timeout_s:
            raise ValueError(
                f"block_ms ({self.block_ms}) must be below socket_timeout_s ({self.socket_timeout_s}) in ms, "
                "else blocking reads time out and retry forever"
            )
        return self


class LoraConfig(Section):
    """LoRA through peft: the learner trains low-rank adapters on the frozen policy (off while rank is 0)."""

    rank: int = Field(
        0,
        ge=0,
        description="Adapter rank r (0 = off: the whole policy is trained). The learner's optimizer and ZeRO-2 then hold only the adapters, and the KL term's reference is the policy with its adapters disabled (no second copy).",
    )
    alpha: float = Field(
        16.0, gt=0, description="LoRA alpha: a layer's update is (alpha / rank) B A."
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapters' input while training (the actors sample without it, so > 0 makes the learner's pi differ from theirs).",
    )
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="Modules that get adapters: peft's `target_modules`, names or name suffixes (e.g. `[q_proj, k_proj, v_proj, o_proj]`), or all-linear (every linear layer but the output head).",
    )
    sync: Literal["merged", "adapter"] = Field(
        "merged",
        description="What the learner publishes per version: merged = the full weights W + (alpha / rank) B A under the base model's names (every engine and transport, the actors never know LoRA is on); adapter = only the adapter tensors (a few % of the bytes): the hf engine swaps them into a peft-wrapped copy of the policy, vLLM loads each version as a new LoRA adapter (requests keep the adapter they started with).",
    )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def adapter_versions(self) -> bool:
        """Whether a published version is the adapters alone (``sync: adapter`` with LoRA on)."""
        return self.enabled and self.sync == "adapter"

    @model_validator(mode="after")
    def _vllm_rank(self) -> LoraConfig:
        if self.rank > 512:
            raise ValueError(f"rank {self.rank}: vLLM serves LoRA ranks up to 512")
        return self


class ModelConfig(Section):
    """The policy checkpoint (a Hugging Face folder or hub id) shared by learner and actors."""

    path: str = Field(
        "",
        description="Required. Hugging Face model folder (config, tokenizer, weights) or hub id `org/name[@revision]` (downloaded into the hub cache; HF_HUB_OFFLINE=1 keeps to the cache), loaded with from_pretrained by learner and actors.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Compute dtype; auto = bfloat16 on GPU, float32 on CPU."
    )
    build: str | None = Field(
        None,
        description="Optional `module:function` (or `path/to/file.py:function`) called as fn(path, seed=run.seed) when nothing exists at `path`, to create the policy folder there before anything loads it; it fills only the path declared with it (in the same file, or the same overrides), so an override that moves `path` drops it and the new path must exist; e.g. the CPU demo's `streamrl.examples.reverse_digits:build_policy`. None = a missing `path` is an error.",
    )
    lora: LoraConfig = Field(
        default_factory=LoraConfig, description="LoRA adapters instead of full training."
    )
    init_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments of the policy's from_pretrained on the learner and the hf actors (TRL's model_init_kwargs), e.g. {attn_implementation: sdpa}. trust_remote_code runs the model repository's own code: never on unless set here (true/false). Keys streamrl sets itself are refused: dtype/torch_dtype (model.dtype), device_map (the learner and actors place the model), revision (model.path's @revision).",
    )

    @field_validator("init_kwargs")
    @classmethod
    def _own_keys(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        taken = {
            "dtype": "model.dtype",
            "torch_dtype": "model.dtype",
            "device_map": "the learner and actors place the model",
            "revision": "model.path's @revision",
        }
        clash = sorted(k for k in kwargs if k in taken)
        if clash:
            raise ValueError(
                "streamrl sets these itself: "
                + ", ".join(f"{k} (set by {taken[k]})" for k in clash)
            )
        if "trust_remote_code" in kwargs and not isinstance(kwargs["trust_remote_code"], bool):
            raise ValueError("trust_remote_code must be true or false")
        return kwargs


class DataConfig(Section):
    """The prompt dataset the actors draw from and its columns."""

    path: str = Field(
        "",
        description="Required. Prompt dataset: JSONL/JSON/Parquet/CSV/Arrow file, a saved or local HF dataset folder, or a hub dataset `org/name` (fetched into the hub cache; HF_HUB_OFFLINE=1 keeps to the cache).",
    )
    config: str | None = Field(
        None, description="Dataset config (subset) name of a hub or local dataset repository."
    )
    format: Literal["auto", "messages", "prompt"] = Field(
        "auto",
        description="messages = a list of {role, content} turns; prompt = a string; auto picks by column name (or by the value of `prompt_key`).",
    )
    prompt_key: str | None = Field(
        None,
        description="Column holding the prompt (string or messages); None = `messages` if present, else `prompt`.",
    )
    answer_key: str | None = Field(
        "answer",
        description="Column passed to the rewards as `answer` (None = no answer column). Every other column reaches the rewards as a keyword argument.",
    )
    split: str = Field("train", description="Split to read from a dataset folder or repository.")
    apply_chat_template: bool | None = Field(
        None,
        description="Render prompts through the tokenizer's chat template: true = always (a string prompt becomes one user turn), false = never (turns' texts joined by newlines), None = for messages rows only.",
    )
    build: str | None = Field(
        None,
        description="Optional `module:function` (or `path/to/file.py:function`) called as fn(path, seed=run.seed) when nothing exists at `path`, to write the dataset there before anything loads it; it fills only the path declared with it (in the same file, or the same overrides), so an override that moves `path` drops it and the new path must exist; e.g. the CPU demo's `streamrl.examples.reverse_digits:write_dataset`. None = a missing `path` is an error.",
    )
    eval_path: str | None = Field(
        None,
        description="Held-out prompt dataset (same forms and columns as `path`); None = no evaluation.",
    )
    eval_split: str | None = Field(None, description="Split of `eval_path` (None = `split`).")
    eval_every: int = Field(
        0,
        ge=0,
        description="Evaluate every this many policy versions on one actor (0 = off): mean reward and pass@1 sampled at rollout.temperature and greedy, to <run.dir>/eval.jsonl and TensorBoard.",
    )
    eval_size: int = Field(
        64, ge=1, description="Most eval prompts per evaluation (the first ones)."
    )


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


# the ranges the built-in reward functions declare (actors.rewards.BUILTINS): all are rates
BUILTIN_REWARD_RANGES: dict[str, tuple[float, float]] = {
    name: (0.0, 1.0) for name in ("exact_match", "gsm8k", "math", "think_format", "code")
}


class RewardSpec(Section):
    """One reward function and its weight."""

    fn: str = Field(
        ...,
        description="Built-in reward (exact_match, gsm8k, math, think_format, code), or a plug-in as `module:function` or `path/to/file.py:function` taking (messages, answer, **columns) -> float | dict, or TRL's batched form (see `batched`).",
    )
    batched: bool | None = Field(
        None,
        description="TRL's batched form: fn(prompts, completions, completion_ids, **columns) -> list[float | None], every argument a list over a chunk of samples. None = read from the signature: a `prompts`, `completions` or `completion_ids` parameter and no `messages` is TRL's form; true/false force it.",
    )
    name: str | None = Field(
        None,
        description="What this function's reward parts are named in step rows, metrics and `run.target_parts` (None = `fn`).",
    )
    weight: float = Field(1.0, description="Weight of this reward in the total.")
    range: tuple[float, float] | None = Field(
        None,
        description="[low, high] the function's value and each of its parts lie in, e.g. [0, 1] for a rate. None = a built-in's declared range ([0, 1] for all of them), else [-broker.max_abs_reward, broker.max_abs_reward]. An actor scores a value outside as a failure (`invalid`); the learner dead-letters an entry whose part lies outside, and clips each step's part means to it for `run.target_parts`.",
    )
    kwargs: dict = Field(
        default_factory=dict, description="Extra keyword arguments passed to the reward function."
    )

    @field_validator("range")
    @classmethod
    def _low_to_high(cls, value):
        if value is not None and not value[0] <= value[1]:
            raise ValueError(f"range {list(value)}: low is above high")
        return value


class RewardConfig(Section):
    """Reward functions and how their failures are contained."""

    functions: list[RewardSpec] = Field(
        default_factory=list,
        description="Required (at least one). Rewards summed with their weights into the scalar reward.",
    )
    timeout_s: float = Field(
        5.0,
        gt=0,
        description="Per-sample time limit of a reward call; past it the sample scores 0 and is counted.",
    )
    workers: int = Field(1, ge=1, description="Reward worker processes per actor.")
    worker_memory_mb: int = Field(
        1024,
        ge=16,
        description="Memory a reward worker may allocate beyond its start-up size (address-space limit); past it the sample scores 0.",
    )
    max_failing_steps: int = Field(
        3,
        ge=1,
        description="The learner stops the run, printing the reward function's last exception, after this many steps in a row in which one function failed on more than half of the step's samples.",
    )
    sandbox_memory_mb: int = Field(
        512, ge=16, description="Address-space limit of the code-execution sandbox."
    )
    sandbox_timeout_s: float = Field(
        5.0,
        gt=0,
        description="Wall-clock limit of one sandboxed program; its whole process group is killed after it.",
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


# Where each engine (``actor.engine``) computes: "device" = on ``actor.device``; "gpu" = on the
# host's GPU when it has one, else on the CPU (vLLM, whose CPU build runs there). The learner
# publishes in the dtype the engines compute in (``weightsync.publisher.transfer_dtype``); the
# engines themselves are ``actors.engines``' registry, which tests/test_structure.py holds to this.
ENGINE_PLACEMENT = {"hf": "device", "vllm": "gpu"}

# The transports whose actors open the learner's GPU memory by CUDA IPC handle (the transport's
# ``device_ipc`` capability, which tests/test_weightsync_cuda_ipc.py holds to this): they need the
# learner's GPU visible to every actor on its host.
DEVICE_IPC_TRANSPORTS = frozenset({"cuda_ipc"})


class ActorConfig(Section):
    """Actor processes and their generation engine."""

    engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="Generation engine: hf (transformers, any device) or vllm (vLLM on GPUs, or its CPU build: make .venv-vllm).",
    )
    engines: list[Literal["hf", "vllm"]] | None = Field(
        None,
        min_length=1,
        description="Per-actor engines of a supervised run (`make run`): actor i runs engines[i % len], passed to it as `actor.engine`; e.g. [vllm, hf] mixes the two. None = every actor runs `engine`. With vllm in it the whole run needs the vLLM venv.",
    )
    device: str = Field("cpu", description="torch device of the hf engine.")
    cuda_graphs: Literal["auto", "on", "off"] = Field(
        "auto",
        description="hf engine decode on CUDA: on = a static KV cache per slot and each decode step replayed as a CUDA graph captured per batch-size bucket (powers of two up to batch_slots), weights copied into the parameters in place; off = the dynamic cache (each step launched from Python); auto = on when actor.device is CUDA, off on CPU. on with a CPU actor.device is refused.",
    )
    batch_slots: int = Field(
        64,
        ge=1,
        description="Concurrent sequences of one actor's engine: the hf engine's decode batch, vLLM's max_num_seqs.",
    )
    refill: bool = Field(
        True,
        description="Keep the engine's batch full across groups (source `prompts`): once a group's worth of slots is free, the next admitted groups take them, so no slot waits for a batch's longest completion (real completions' lengths are long-tailed). False: a batch of batch_slots / group_size groups is generated before the next is admitted. Either way each group is published as soon as its completions are done. Where every completion has the same few tokens it buys nothing: on the CPU demo (4 tokens) learner steps took 1.02-1.06x as long with it (3 seeds, 2026-11-28).",
    )
    heartbeat_s: float = Field(
        2.0, gt=0, description="Heartbeat period; an actor is considered dead after 3 missed beats."
    )
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Prometheus port of the first actor (0 = free port); later actors use free ports.",
    )
    gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="vLLM: fraction of GPU memory for weights and KV cache."
    )
    tensor_parallel_size: int = Field(
        1, ge=1, description="vLLM: tensor parallel degree of one actor."
    )
    max_actors: int = Field(
        64,
        ge=0,
        description="Most supervised actors a scale command (launch:control in Redis, make scale) may ask for; larger requests are clamped to it and logged.",
    )
    publish_log: bool = Field(
        False,
        description="Append every published group id and its stream entry id to <run.dir>/published/<actor id>.jsonl (audit; the chaos harness checks delivery against it).",
    )
    gpus: list[int] | Literal["share"] | None = Field(
        None,
        description='GPUs of the supervised actors (of `streamrl run`, and of `streamrl actors` on each actors host), as indices into the devices the launcher sees (its CUDA_VISIBLE_DEVICES, else all): actor i gets the (i mod n)-th group of `tensor_parallel_size` indices as its CUDA_VISIBLE_DEVICES, so more actors than GPUs share them round-robin (each vLLM actor then takes `gpu_memory_utilization` of its GPU). "share" = every actor on the learner\'s one GPU (`learner.gpus` of length 1, else GPU 0), beside it. None = no placement: children inherit CUDA_VISIBLE_DEVICES.',
    )
    staggered_start: bool = Field(
        False,
        description="`make run` starts the first actor with the learner and each further one once the one before it has sent its first heartbeat, instead of all at once. Start-up is CPU-bound (imports, model loading): on 2 cores the demo's first trained step came 6.8 s after the launch this way, 9.5 s with the learner and both actors starting at once (medians of 5, docs/benchmarks.md \"Start-up\"). An actor started later runs its start-up on its `actor.cpus`, off the learner's cores. On a host with a core per process it only delays the later actors.",
    )
    cpus: list[int] | Literal["auto"] | None = Field(
        None,
        description='CPU cores the supervised actors run on once each has started (start-up uses every core), as indices into the cores the launcher may use (its affinity: `taskset`, a cgroup cpuset); every actor gets the whole list, its threads and child processes (reward workers) included. "auto" = the launcher\'s cores that `learner.cpus` "auto" does not take, for hf actors only (vLLM places its own threads), and only when the learner gets cores of its own. None = no pinning.',
    )

    @field_validator("cuda_graphs", mode="before")
    @classmethod
    def _yaml_on_off(cls, value):
        # YAML reads a bare on / off as a boolean
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _graphs_need_cuda(self) -> ActorConfig:
        if self.cuda_graphs == "on" and not self.device.startswith("cuda"):
            raise ValueError(
                f"actor.cuda_graphs=on needs a CUDA actor.device (CUDA graphs), not {self.device!r}: use auto or off"
            )
        return self

    def engine_of(self, index: int) -> str:
        """The engine of the supervised actor with this index (a0, a1, ...)."""
        return self.engines[index % len(self.engines)] if self.engines else self.engine

    @property
    def engines_in_use(self) -> set[str]:
        """Every engine some actor of the run computes with."""
        return set(self.engines) if self.engines else {self.engine}


class AlgoConfig(Section):
    """The RL objective: advantages, staleness bound, importance weights and clipping, aggregation."""

    max_staleness: int = Field(
        2,
        ge=0,
        description="Tokens (and groups) older than this many versions are masked/dropped; also the admission-control bound.",
    )
    advantage: Literal["grpo", "drgrpo"] = Field(
        "grpo", description="grpo = (r - mean)/(std + eps); drgrpo = r - mean (no std)."
    )
    adv_eps: float = Field(1e-4, gt=0, description="eps in (r - mean)/(std + eps).")
    std_threshold: float = Field(
        1e-6,
        ge=0,
        description="Adaptive fallback: a group whose reward std is below this uses mean subtraction only.",
    )
    skip_zero_variance: bool = Field(
        True,
        description="Leave groups whose rewards are all equal out of the update (they still count in the loss normaliser and are counted); ignored while kl_coef or entropy_coef is on, whose terms give those tokens a gradient.",
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO's dynamic sampling: a step keeps reading until groups_per_step of its groups carry a signal (neither zero-variance nor wholly stale); the others are counted, acked with the step and left out of the loss normaliser. Uses the actors' spare generation once most groups are solved or collapsed.",
    )
    dynamic_sampling_max_groups: int = Field(
        0,
        ge=0,
        description="Most groups one step reads under dynamic_sampling (0 = 8 x groups_per_step, never fewer than groups_per_step); a step that reaches it trains on the signal it has.",
    )
    clip_low: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="PPO ratio clip: r is clipped to [1 - clip_low, 1 + clip_high].",
    )
    clip_high: float = Field(
        0.2, ge=0, description="Upper clip range (DAPO's clip-higher when > clip_low)."
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token",
        description="token = one ratio pi_theta/pi_prox per token; sequence = GSPO: one ratio per completion, exp of the mean over its tokens of the log-ratio, clipped with sequence_clip_low/high (TRL's importance_sampling_level). The truncated IS weight and the KL stay per token; GSPO's paper averages per sequence (aggregation: seq_mean).",
    )
    sequence_clip_low: float = Field(
        3e-4,
        ge=0,
        lt=1,
        description="Lower clip range of the sequence ratio under importance_sampling_level: sequence (the GSPO paper's 3e-4: a mean log-ratio moves far less than a token's).",
    )
    sequence_clip_high: float = Field(
        4e-4,
        ge=0,
        description="Upper clip range of the sequence ratio under importance_sampling_level: sequence (the GSPO paper's 4e-4).",
    )
    rho_max: float = Field(
        2.0,
        gt=0,
        description="Truncation of the importance weight exp(pi_prox - mu) (V-trace rho-bar).",
    )
    importance_correction: bool = Field(
        True,
        description="Decoupled objective with the truncated IS weight; off = plain PPO ratio against the behaviour policy.",
    )
    staleness_tighten: float = Field(
        0.0,
        ge=0,
        description="Per version of staleness, shrink the clip ranges towards 0 and rho_max towards 1 by this fraction of their size (0 = off).",
    )
    proximal: Literal["recompute", "behaviour"] = Field(
        "recompute",
        description="pi_prox source: recompute with a no-grad pass, or reuse the behaviour log-probs.",
    )
    aggregation: Literal["token_mean", "seq_mean", "constant"] = Field(
        "token_mean",
        description="Loss aggregation: over all tokens, per sequence then mean, or sum / constant (Dr.GRPO).",
    )
    constant_normalizer: int = Field(
        0,
        ge=0,
        description="Normaliser for aggregation=constant (0 = a completion's token budget x batch size: rollout.max_new_tokens, or env.max_total_tokens for multi-turn trajectories, agent.max_total_tokens for agents).",
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="k3 KL penalty to the frozen initial policy (0 = off, no reference model kept).",
    )
    reference_on: Literal["learner", "actors"] = Field(
        "learner",
        description="Where the frozen initial policy scores the completions for the KL term: a no-grad pass on the learner, or on each actor right after generating (every actor then holds one more copy of model.path and sends the per-token log-probs with the group; entries without them are dead-lettered). The learner is usually what the actors wait for, so moving that pass to them shortens every step. Unused when kl_coef is 0.",
    )

    @property
    def actors_score_reference(self) -> bool:
        """Whether the actors send the KL term's reference log-probs (a KL term, reference_on: actors)."""
        return self.kl_coef > 0 and self.reference_on == "actors"

    @property
    def learner_scores_reference(self) -> bool:
        """Whether the learner runs the KL term's reference pass itself (a KL term, reference_on: learner)."""
        return self.kl_coef > 0 and self.reference_on == "learner"

    entropy_coef: float = Field(
        0.0,
        ge=0,
        description="Entropy bonus: subtracts coef x the policy's per-token entropy from the loss; counters collapse onto one wrong answer (0 = off).",
    )


class LearnerConfig(Section):
    """The DeepSpeed learner: optimizer, batching, checkpoints, acknowledgement."""

    lr: float = Field(1e-6, gt=0, description="AdamW learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    warmup_steps: int = Field(
        0,
        ge=0,
        description="Linear LR warm-up, in optimizer steps (minibatches x updates_per_batch per learner step): the LR rises from 0 at the first to `lr` after warmup_steps (transformers' schedules, as TRL's).",
    )
    lr_scheduler: Literal["auto", "constant", "linear", "cosine"] = Field(
        "auto",
        description="LR after the warm-up, over run.max_steps learner steps of minibatches x updates_per_batch optimizer steps each (transformers' get_scheduler, TRL's lr_scheduler_type): constant; linear = decays to 0 at run.max_steps; cosine = half a cosine down to 0 at run.max_steps; auto = linear (TRL's default) when run.max_steps is set, else constant (no step limit, no horizon to decay over). linear and cosine need run.max_steps.",
    )
    init_optimizer: Literal["auto", "fresh"] = Field(
        "auto",
        description="What a new run's AdamW starts from (a resumed run's checkpoint holds its own). auto = the moments and step count a warm start saved next to the policy (`optimizer.pt`, written by `streamrl.learner.init_optimizer.save`, as the demo's policy builder does) where they fit the learner's optimizer (same trainable parameter names and shapes, betas, eps), else a fresh AdamW, the learner's log saying why; fresh = always a fresh AdamW.",
    )
    grad_clip: float = Field(1.0, ge=0, description="Gradient norm clip (0 = off).")
    groups_per_step: int = Field(
        16, ge=1, description="Rollout groups consumed by one optimizer step (across all ranks)."
    )
    updates_per_batch: int = Field(
        1,
        ge=1,
        description="Passes over one consumed batch (PPO epochs); each pass takes `minibatches` optimizer steps, each of which publishes a version.",
    )
    minibatches: int = Field(
        1,
        ge=1,
        description="Disjoint random mini-batches one pass splits the batch into, one optimizer step each (PPO style); the clip and IS weight stay relative to the policy at the start of the batch.",
    )

    @property
    def versions_per_batch(self) -> int:
        """Policy versions one consumed batch publishes (one per optimizer step)."""
        return self.updates_per_batch * self.minibatches

    micro_batch_tokens: int = Field(
        8192,
        ge=1,
        description="Token budget of one micro-batch: its packed rows (short samples end to end, each attending only to itself) x the longest sample; samples are never split. It bounds the activations (the logits: the completion tokens among them x vocabulary); the loss is the mini-batch's whatever the split.",
    )
    logprob_chunk_tokens: int = Field(
        1024,
        ge=1,
        description="Completion tokens whose logits (tokens x vocabulary, float32) the learner's log-prob and entropy pass holds at once; each chunk is recomputed in the backward pass, so autograd keeps only the hidden states (one more output-layer forward per step). 1024 x Qwen's 151,936 = 0.6 GB per chunk.",
    )
    packed_attention: Literal["auto", "varlen", "mask"] = Field(
        "auto",
        description="How an sdpa policy keeps the samples of a packed row apart in the learner's passes (other attention implementations are left as they are). mask = transformers' 4D mask from the position ids ([rows, width, width]; on a GPU it keeps sdpa off its flash kernel); varlen = no mask: causal attention within each sample's bounds (policy.packed_attention: torch's variable-length flash kernel on a CUDA GPU in bf16/fp16, one causal sdpa per sample elsewhere), the same arithmetic; auto = varlen on a CUDA learner, mask on a CPU one.",
    )
    peak_tflops: float | None = Field(
        None,
        ge=0,
        description="The learner GPU's dense bf16 peak, TFLOP/s per rank, that the step row's mfu divides by (x the learner's ranks). None or 0 = from the table of known GPUs by CUDA device name (learner.throughput); on a CPU learner or an unknown GPU mfu is left empty unless this is set.",
    )
    zero_stage: Literal[0, 1, 2] = Field(2, description="DeepSpeed ZeRO stage.")
    offload_optimizer: bool = Field(
        False,
        description="DeepSpeed ZeRO offload_optimizer to CPU (stage 1 or 2): the fp32 master weights, gradients and Adam moments live in pinned host memory and the optimizer steps on the CPU, with DeepSpeedCPUAdam on a GPU host (built once on first use, ~1-2 min, cached under TORCH_EXTENSIONS_DIR; torch AdamW if it cannot build) and torch AdamW on a CPU learner. Frees ~16 bytes per parameter on the GPU.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward pass (transformers' gradient checkpointing, non-reentrant) instead of keeping them: activation memory per token drops from every layer's to about one layer's, for ~30 % more forward compute.",
    )
    gpus: list[int] | None = Field(
        None,
        description="GPUs of the learner ranks, one per rank (length = `ranks`), as indices into the devices the launcher sees; the learner gets them as its CUDA_VISIBLE_DEVICES and rank r takes the r-th. None = no placement (inherited CUDA_VISIBLE_DEVICES; rank r takes cuda:r).",
    )
    cpus: list[int] | Literal["auto"] | None = Field(
        None,
        description='CPU cores the learner ranks run on once started (start-up uses every core), as indices into the cores the launcher may use (its affinity: `taskset`, a cgroup cpuset); its threads included. "auto" = on a host without NVIDIA GPUs (none in the launcher\'s CUDA_VISIBLE_DEVICES, else no /dev/nvidiaN), the first `ranks` x `run.torch_threads` of them, when at least one core is left for the actors; otherwise no pinning. A learner that trains on the CPU and shares its cores with the actors (and Redis, and the launcher) is preempted mid-step and its caches evicted: on 2 cores the demo\'s learner steps took 1.1-1.2x as long unpinned (docs/benchmarks.md, "CPU placement"). None = no pinning.',
    )
    checkpoint_every: int = Field(
        50, ge=1, description="Save a resumable checkpoint every N steps (and at shutdown)."
    )
    ack_policy: Literal["step", "checkpoint"] = Field(
        "checkpoint",
        description="Ack consumed entries after every step, or only once a checkpoint holds the step (crash replays exactly the lost steps).",
    )
    read_timeout_s: float = Field(
        0.0,
        ge=0,
        description="Give up waiting for data after this long and exit (0 = wait forever).",
    )
    metrics_port: int = Field(
        0, ge=0, le=65535, description="Prometheus port of learner rank 0 (0 = free port)."
    )
    ranks: int = Field(
        1,
        ge=1,
        description="Learner ranks (data parallel) on each node: `streamrl run` and `streamrl learner` start them with torchrun --nproc-per-node; `streamrl learner --nnodes N` starts this many on each of N nodes.",
    )
    max_crashes: int = Field(
        5,
        ge=1,
        description="`make run` stops the run, showing the learner's last traceback, once the learner has crashed this many times within `crash_window_s` (instead of restarting it forever).",
    )
    crash_window_s: float = Field(
        600.0, gt=0, description="The window of `max_crashes`, in seconds."
    )
    commit_log: bool = Field(
        False,
        description="Append the group ids of every acked (committed) batch, with the step that covers them, to <run.dir>/learner_commits.jsonl (audit; the chaos harness checks exactly-once training against it).",
    )


class SupervisedConfig(Section):
    """`streamrl sft` and `streamrl dpo`: the dataset and the loss of a supervised run on the learner (no actors, no Redis)."""

    path: str | None = Field(
        None,
        description="JSONL dataset, one example a line. sft: `messages` (a chat, the loss on the assistant turns only) or `prompt` + `completion` (the loss on the completion and an end-of-sequence token). dpo: `chosen` + `rejected`, either strings after a `prompt` (string or messages) or whole chats whose last assistant turn is the response (TRL's and RL2's formats). Required by both commands.",
    )
    build: str | None = Field(
        None,
        description="`module:function` that writes the dataset at `path` when it is missing, called as fn(path, seed=run.seed) (the demo presets generate theirs); it fills only the path it was declared with.",
    )
    epochs: int = Field(
        1, ge=1, description="Passes over the dataset (`run.max_steps` may end the run sooner)."
    )
    batch_size: int = Field(
        64, ge=1, description="Examples (sft) or pairs (dpo) per optimizer step, across all ranks."
    )
    shuffle: bool = Field(
        True,
        description="Draw each epoch's order from `run.seed` and the epoch (False: file order).",
    )
    max_length: int = Field(
        2048,
        ge=2,
        description="Tokens an example (prompt + response) may hold; a longer one is cut from the right.",
    )
    beta: float = Field(0.1, gt=0, description="dpo: beta of the sigmoid loss, tau of IPO.")
    loss: Literal["sigmoid", "ipo"] = Field(
        "sigmoid",
        description="dpo: sigmoid = DPO's -log sigmoid(beta x margin) over summed log-prob ratios; ipo = (margin of per-token mean log-prob ratios - 1/(2 beta))^2 (TRL's loss_type of the same name).",
    )
    save_optimizer: bool = Field(
        False,
        description="Write the AdamW state next to the exported policy (`optimizer.pt`), so that an RL run with `learner.init_optimizer: auto` continues its moments (the demos' warm starts do).",
    )


def _check_indices(key: str, indices: list[int], what: str = "GPU") -> None:
    if not indices:
        raise ValueError(f"{key}=[]: list at least one {what} (or leave it unset)")
    if any(i < 0 for i in indices):
        raise ValueError(f"{key}={indices}: {what} indices must be >= 0")
    if len(set(indices)) != len(indices):
        raise ValueError(f"{key}={indices}: an index is listed twice")


class WeightSyncConfig(Section):
    """Moving new weights from the learner to the actors."""

    transport: Literal["shm", "cuda_ipc", "dist", "none"] = Field(
        "shm",
        description="shm = POSIX shared memory (one host); cuda_ipc = GPU actors on the learner's host copy each version device to device from slots on the learner's GPU, shared once as CUDA IPC handles (needs CUDA actors on the learner's host, actor.device cuda, no relay; with actor.gpus a list each actor also sees the learner's GPU, after its own, and copies from it peer to peer; costs `slots` copies of the weights in GPU memory on the learner's GPU); dist = torch.distributed broadcast (NCCL/gloo); none = actors keep version 0.",
    )
    slots: int = Field(
        3,
        ge=2,
        description="shm, cuda_ipc: ring of slots, so the publisher never overwrites a slot a reader is copying (cuda_ipc: on the learner's GPU).",
    )
    staging_buffers: int = Field(
        2,
        ge=1,
        le=4,
        description="shm: host buffers the learner copies each version into before a background thread writes it out (pinned when the learner is on a GPU). The learner waits only when the next one is still being written out; each costs one copy of the weights in the transfer dtype.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Dtype weights travel in; converted once on the publisher side (auto = engine dtype).",
    )
    bucket_bytes: int = Field(64 << 20, ge=1 << 16, description="dist: broadcast bucket size.")
    timeout_s: float = Field(
        30.0,
        gt=0,
        description="Upper bound of every blocking transfer call; a slow or dead peer is dropped after it.",
    )
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="dist: process-group backend (auto = nccl with CUDA, else gloo)."
    )
    dist_host: str | None = Field(
        None,
        description="dist: the learner host's address that actors (or relays) reach its rendezvous store and group on; gloo binds it too. None = the address its traffic to the broker leaves from: loopback while the broker is on loopback (the run stays on this host), else routable (if the broker's name resolves to this host's loopback: the default route's address, else any interface's that is up).",
    )
    dist_port: int = Field(
        29600,
        ge=0,
        le=65535,
        description="dist: first TCP port of the learner's rendezvous store (the first free one of `dist_port`..`dist_port + dist_ports - 1` is taken; 0 = any free port). A firewall must let actor hosts reach this range on the learner host, and let the process group's own connections through both ways: gloo and NCCL open them on ephemeral ports, which neither lets you pin (docs/multihost.md).",
    )
    dist_ports: int = Field(
        8,
        ge=1,
        le=1024,
        description="dist: how many ports from `dist_port` on the store may take (runs or learners sharing a host take one each).",
    )
    relay: bool = Field(
        False,
        description="dist: one relay per actor host (`python -m streamrl.weightsync.relay`, started by `streamrl actors`) joins the learner's group and hands each version to its host's actors over shm, so one copy per host crosses the network; the learner's own host's actors read the learner's shm. False = every actor joins the group itself (NCCL straight into its GPU).",
    )


class MetricsConfig(Section):
    """Prometheus endpoints of every process."""

    host: str = Field(
        "127.0.0.1",
        description="Bind address of every metrics endpoint (loopback unless you expose it on purpose).",
    )
    enabled: bool = Field(True, description="Serve Prometheus metrics from every process.")


class Config(Section):
    """The whole config of a run."""

    run: RunConfig = Field(default_factory=RunConfig)
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    weightsync: WeightSyncConfig = Field(default_factory=WeightSyncConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    supervised: SupervisedConfig = Field(default_factory=SupervisedConfig)

    @model_validator(mode="after")
    def _placement(self) -> Config:
        learner, actor = self.learner, self.actor
        for key, cpus in (("learner.cpus", learner.cpus), ("actor.cpus", actor.cpus)):
            if isinstance(cpus, list):
                _check_indices(key, cpus, "CPU")
        if learner.gpus is not None:
            _check_indices("learner.gpus", learner.gpus)
            if len(learner.gpus) != learner.ranks:
                raise ValueError(
                    f"learner.gpus={learner.gpus} lists {len(learner.gpus)} GPU(s) for learner.ranks={learner.ranks}: one per rank"
                )
        if actor.gpus == "share":
            if learner.ranks != 1:
                raise ValueError(
                    f'actor.gpus="share" puts the actors on the learner\'s one GPU, but learner.ranks={learner.ranks}'
                )
            if actor.tensor_parallel_size != 1:
                raise ValueError(
                    f'actor.gpus="share" gives each actor one GPU; actor.tensor_parallel_size={actor.tensor_parallel_size}'
                )
        if actor.gpus is not None:
            # a placed actor sees only its own GPUs, numbered from 0
            group = 1 if actor.gpus == "share" else actor.tensor_parallel_size
            kind, _, index = actor.device.partition(":")
            if kind == "cuda" and index.isdigit() and int(index) >= group:
                raise ValueError(
                    f"actor.device={actor.device} with actor.gpus={actor.gpus}: each actor sees only "
                    f"its own {group} GPU(s) as cuda:0..{group - 1}"
                )
        if isinstance(actor.gpus, list):
            _check_indices("actor.gpus", actor.gpus)
            if len(actor.gpus) % actor.tensor_parallel_size:
                raise ValueError(
                    f"actor.gpus={actor.gpus}: its length must be a multiple of actor.tensor_parallel_size={actor.tensor_parallel_size}"
                )
            # whether they overlap the learner's GPUs is the launcher's to check: on an actors
            # host (`streamrl actors`) the learner is elsewhere (launch.placement.check)
        return self

    @property
    def rollout_source(self) -> str:
        """What the actors roll out (``actors.sources``): agents' calls, an environment's
        trajectories, or dataset prompts' completions."""
        if self.agent.enabled:
            return "agent"
        return "environment" if self.env.name else "prompts"

    @property
    def reward_ranges(self) -> dict[str, tuple[float, float]]:
        """Measure -> the range its values lie in: each reward function's parts (by part name),
        the bonus part of an environment (``env``) or of agents (``agent``), and the total
        (``reward``: the weighted sum of the functions' ranges and the bonus's). A config that
        names no reward (a learner fed by actors configured elsewhere) bounds the total by
        ``broker.max_abs_reward``."""
        fallback = (-self.broker.max_abs_reward, self.broker.max_abs_reward)
        if not self.reward.functions and not self.env.name and not self.agent.enabled:
            return {"reward": fallback}
        ranges, low, high = {}, 0.0, 0.0
        for spec in self.reward.functions:
            lo, hi = spec.range or BUILTIN_REWARD_RANGES.get(spec.fn, fallback)
            ranges[spec.name or spec.fn] = (lo, hi)
            # 0 too: a function that failed, or was not called (an agent's own reward), adds 0
            low += min(0.0, spec.weight * lo, spec.weight * hi)
            high += max(0.0, spec.weight * lo, spec.weight * hi)
        bonus = {}
        if self.env.name:
            bonus["env"] = fallback
        if self.agent.enabled:
            bonus["agent"] = tuple(self.agent.reward_range)
        for name, (lo, hi) in bonus.items():
            ranges[name] = (lo, hi)
            low, high = low + min(0.0, lo), high + max(0.0, hi)
        if self.env.name and self.env.truncated_reward is not None:
            low = min(low, self.env.truncated_reward)
            high = max(high, self.env.truncated_reward)
        return ranges | {"reward": (low, high)}

    @property
    def completion_limit(self) -> tuple[str, int]:
        """The knob that bounds one completion, and its value: a trajectory's tokens after its
        prompt for an environment or agents, else the tokens one completion may sample."""
        if self.agent.enabled:
            return "agent.max_total_tokens", self.agent.max_total_tokens
        if self.env.name is not None:
            return "env.max_total_tokens", self.env.max_total_tokens
        return "rollout.max_new_tokens", self.rollout.max_new_tokens

    def sections_for(self, build) -> dict[str, Section]:
        """The sections a registry's ``from_config`` names as keyword-only parameters, by name:
        a source or an engine gets exactly the settings it reads."""
        params = inspect.signature(build).parameters.values()
        return {p.name: getattr(self, p.name) for p in params if p.kind is p.KEYWORD_ONLY}

    @model_validator(mode="after")
    def _device_ipc_actors(self) -> Config:
        ws, actor = self.weightsync, self.actor
        if ws.transport not in DEVICE_IPC_TRANSPORTS:
            return self
        why = f"weightsync.transport={ws.transport} copies weights from the learner's GPU into GPU actors on its host"
        if ws.relay:
            raise ValueError(
                f"weightsync.relay=true: relays serve actors on other hosts over shm, but {why}; use weightsync.transport=dist with relays"
            )
        on_device = [e for e in sorted(actor.engines_in_use) if ENGINE_PLACEMENT[e] == "device"]
        if on_device and not actor.device.startswith("cuda"):
            raise ValueError(
                f"actor.device={actor.device} for the {', '.join(on_device)} engine: {why}; use weightsync.transport=shm for CPU actors"
            )
        return self

    @model_validator(mode="after")
    def _lr_horizon(self) -> Config:
        scheduler = self.learner.lr_scheduler
        if scheduler in ("linear", "cosine") and self.run.max_steps == 0:
            raise ValueError(
                f"learner.lr_scheduler={scheduler} decays the LR to 0 at run.max_steps, which is 0 "
                "(no limit): set run.max_steps, or learner.lr_scheduler=constant"
            )
        return self

    @model_validator(mode="after")
    def _one_rollout_source(self) -> Config:
        if self.agent.enabled and self.env.name:
            raise ValueError(
                f"agent.enabled and env.name={self.env.name!r}: an actor either serves agents or runs an environment, not both"
            )
        return self

    @model_validator(mode="after")
    def _target_parts_are_reward_parts(self) -> Config:
        fns = [spec.name or spec.fn for spec in self.reward.functions]
        unknown = [
            part
            for part in self.run.target_parts
            if not any(part == fn or part.startswith(fn + "/") for fn in fns)
        ]
        if unknown:
            raise ValueError(
                f"run.target_parts names {unknown}, not a reward part of this task: parts are named "
                f"after reward.functions ({fns}) as `fn` (or its `name`), or `fn/key` for a function returning a dict"
            )
        return self
