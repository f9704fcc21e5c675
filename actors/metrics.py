"""Actor metrics (prometheus-client), defined once here; names and units as in docs/architecture.md."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

TOKENS_GENERATED = Counter(
    "streamrl_actor_tokens_generated_total", "Completion tokens sampled by this actor."
)
TOKENS_PUBLISHED = Counter(
    "streamrl_actor_tokens_published_total",
    "Completion tokens of the groups this actor added to the stream (with the learner's "
    "streamrl_learner_tokens_trained_total: the fraction generated but never trained).",
)
GROUPS_PUBLISHED = Counter(
    "streamrl_actor_groups_published_total", "Scored rollout groups added to the stream."
)
COMPLETION_LENGTH = Histogram(
    "streamrl_actor_completion_length_tokens",
    "Tokens per completion.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
)
REWARD = Histogram(
    "streamrl_actor_reward",
    "Total reward per completion.",
    buckets=(-1, -0.5, 0, 0.1, 0.25, 0.5, 0.75, 0.9, 1, 2, 5),
)
REWARD_PART = Gauge(
    "streamrl_actor_reward_part", "Mean of a named reward part over the last group.", ["part"]
)
REWARD_FAILURES = Counter(
    "streamrl_actor_reward_failures_total", "Reward calls that failed and scored 0.", ["kind"]
)
ADMISSION_WAIT_SECONDS = Counter(
    "streamrl_actor_admission_wait_seconds_total",
    "Time spent waiting for admission control or fresh weights.",
)
GENERATE_SECONDS = Counter(
    "streamrl_actor_generate_seconds_total", "Time spent inside engine.generate."
)
REFERENCE_SECONDS = Counter(
    "streamrl_actor_reference_seconds_total",
    "Time spent scoring completions under the frozen reference policy (algo.reference_on: actors).",
)
WEIGHT_SWAP_SECONDS = Histogram(
    "streamrl_actor_weight_swap_seconds",
    "Time to copy staged weights into the engine between two decode steps.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
POLICY_VERSION = Gauge("streamrl_actor_policy_version", "Policy version the engine samples with.")
VERSION_LAG = Gauge("streamrl_actor_version_lag", "Learner version minus the engine's version.")
ENV_TURNS = Counter(
    "streamrl_actor_env_turns_total",
    "Model turns of the multi-turn trajectories this actor finished (with "
    "streamrl_actor_env_trajectories_total: turns per trajectory).",
)
ENV_TRAJECTORIES = Counter(
    "streamrl_actor_env_trajectories_total",
    "Multi-turn trajectories finished, by why they ended (done, a limit, or a failed step).",
    ["reason"],
)
ENV_STEP_SECONDS = Histogram(
    "streamrl_actor_env_step_seconds",
    "Time of one environment step call (a timed-out call counts its timeout).",
    buckets=(0.0001, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
ENV_TOOL_CALLS = Counter(
    "streamrl_actor_env_tool_calls_total", "<tool_call> blocks the model wrote in its turns."
)
ENV_TOOL_FAILURES = Counter(
    "streamrl_actor_env_tool_failures_total",
    "Tool calls that failed, by reason: parse (not {name, arguments} JSON), unknown_tool, "
    "bad_arguments, raised (the tool raised; its trajectory ends with error).",
    ["reason"],
)
