"""Learner Prometheus metrics (names in docs/architecture.md), defined once; rank 0 serves them."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, Summary

STEPS = Counter("streamrl_learner_steps_total", "Learner steps (consumed batches that trained).")
POLICY_VERSION = Gauge(
    "streamrl_learner_policy_version", "Policy version after the last optimizer step."
)
SAMPLES = Counter("streamrl_learner_samples_trained_total", "Completions trained on.")
TOKENS = Counter(
    "streamrl_learner_tokens_trained_total",
    "Completion tokens trained on (not stale, not padding).",
)
SEQUENCE_TOKENS = Counter(
    "streamrl_learner_sequence_tokens_total",
    "Prompt + completion tokens trained on, every pass over a batch (its rate is the learner's tokens/s).",
)
PACKED_TOKENS = Counter(
    "streamrl_learner_packed_tokens_total",
    "Tokens the learner's forward passes ran on: packed rows x their width, padding included "
    "(over streamrl_learner_sequence_tokens_total: the padding overhead).",
)
TOKENS_PER_SECOND = Gauge(
    "streamrl_learner_tokens_per_second",
    "Prompt + completion tokens trained (every pass) per second of the last learner step.",
)
MFU = Gauge(
    "streamrl_learner_mfu",
    "Model FLOP utilisation of the last learner step: 6N (LoRA: 4N + 2 x trained) FLOPs per token "
    "trained (every pass) over the step's seconds x the learner GPUs' bf16 peak (learner.throughput; "
    "learner.peak_tflops). Not set while the peak is unknown (CPU, a GPU not in the table).",
)
STEP_PHASE = Histogram(
    "streamrl_learner_step_phase_seconds",
    "Time of each phase of a learner step.",
    ["phase"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
REWARD = Histogram(
    "streamrl_learner_reward",
    "Rewards of the completions trained on.",
    buckets=(-1, 0, 0.1, 0.25, 0.5, 0.75, 0.9, 1, 2),
)
# loss, KL and gradient norm: one observation per learner step (its last optimizer step), so a
# scrape's rate(_sum) / rate(_count) averages every step since the last one instead of sampling one
LOSS = Summary("streamrl_learner_loss", "Policy loss of each learner step's last optimizer step.")
CLIP_RATIO = Gauge(
    "streamrl_learner_clip_ratio", "Share of tokens whose clipped objective was active."
)
IS_WEIGHT_MEAN = Gauge(
    "streamrl_learner_is_weight_mean",
    "Mean truncated importance weight min(exp(pi_prox - mu), rho).",
)
IS_TRUNCATED = Gauge(
    "streamrl_learner_is_truncated_ratio", "Share of tokens whose importance weight hit rho."
)
REWARD_STD = Gauge(
    "streamrl_learner_reward_std",
    "Mean over the step's groups of the group's reward std (TRL's reward_std).",
)
COMPLETION_LENGTH = Gauge(
    "streamrl_learner_completion_length",
    "Completion length in tokens over the step's batch (TRL's completions/*_length).",
    ["stat"],
)
COMPLETIONS_CLIPPED = Gauge(
    "streamrl_learner_completions_clipped_ratio",
    "Share of the step's completions that hit the token budget (TRL's completions/clipped_ratio).",
)
IS_ESS = Gauge(
    "streamrl_learner_is_ess",
    "Normalised effective sample size of the step's truncated importance weights, "
    "mean(w)^2 / mean(w^2): 1 on-policy, falling as the data drifts from the policy.",
)
BEHAVIOUR_KL = Gauge(
    "streamrl_learner_behaviour_kl",
    "KL(mu || pi_prox) per trained token (k3 estimate): how far the policy moved while the step's "
    "data waited.",
)
STALE_TOKEN_FRACTION = Gauge(
    "streamrl_learner_stale_token_fraction",
    "Share of the step's completion tokens masked or dropped as older than max_staleness.",
)
MAX_STALENESS = Gauge(
    "streamrl_learner_max_staleness",
    "The admission bound in force: algo.max_staleness, or under auto the one the learner set last.",
)
LEARNER_IDLE = Gauge(
    "streamrl_learner_idle_fraction",
    "Share of the step's wall time the learner waited for data (the actors are short when high).",
)
STALENESS = Histogram(
    "streamrl_learner_staleness_versions",
    "Per-token staleness (learner version - sampling version) of consumed tokens.",
    buckets=(0, 1, 2, 3, 4, 6, 8, 16, 32),
)
DROPPED_STALE_TOKENS = Counter(
    "streamrl_learner_dropped_stale_tokens_total",
    "Tokens masked for being older than max_staleness.",
)
DROPPED_STALE_GROUPS = Counter(
    "streamrl_learner_dropped_stale_groups_total", "Groups dropped because every token was stale."
)
ZERO_VARIANCE_GROUPS = Counter(
    "streamrl_learner_zero_variance_groups_total", "Groups skipped because all rewards were equal."
)
KL = Summary(
    "streamrl_learner_kl",
    "Mean k3 KL to the reference (or to the behaviour policy when there is none).",
)
ENTROPY = Gauge(
    "streamrl_learner_entropy",
    "Mean per-token entropy (nats) of the policy on the last batch; a fall towards 0 while reward is low is collapse.",
)
GRAD_NORM = Summary(
    "streamrl_learner_grad_norm",
    "Gradient norm before clipping, each learner step's last optimizer step.",
)
ADVANTAGE_ABS_MEAN = Gauge(
    "streamrl_learner_advantage_abs_mean", "Mean |advantage| of the last batch."
)
ACTORS_ALIVE = Gauge(
    "streamrl_actors_alive", "Actors whose heartbeat has not expired, as the learner last saw them."
)


def observe_staleness(staleness) -> None:
    """Every token's staleness into the histogram."""
    for value in staleness.tolist():
        STALENESS.observe(value)


def observe_step(
    *,
    samples: int,
    tokens: int,
    sequence_tokens: float,
    packed_tokens: float,
    tokens_per_s: float,
    mfu: float | None,
    loss: float,
    grad_norm: float,
) -> None:
    """A trained step's figures that every objective has (the RL learner sets more): its samples
    and tokens (``sequence_tokens``, ``packed_tokens``: every pass's), its rate and MFU, the loss
    and gradient norm of its last optimizer step."""
    STEPS.inc()
    SAMPLES.inc(samples)
    TOKENS.inc(tokens)
    SEQUENCE_TOKENS.inc(sequence_tokens)
    PACKED_TOKENS.inc(packed_tokens)
    TOKENS_PER_SECOND.set(tokens_per_s)
    if mfu is not None:
        MFU.set(mfu)
    LOSS.observe(loss)
    GRAD_NORM.observe(grad_norm)
