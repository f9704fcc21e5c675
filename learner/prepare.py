"""From stream deliveries to one step's batch: which groups train, their advantages, the step's figures.

A group whose every token is older than ``algo.staleness_limit`` (the bound; ``auto``'s highest)
is dropped (counted). A group whose rewards are all equal has zero advantage: it is skipped (its
samples still count in the loss normaliser) when nothing else gives it a gradient, and left out
entirely under dynamic sampling (DAPO's batch: only groups with a signal, read on until ``groups_per_step`` of them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from streamrl.broker import env_stats, reward_failures
from streamrl.broker.semantics import is_stale
from streamrl.configs.schema import AlgoConfig
from streamrl.learner import algorithm
from streamrl.learner import metrics as m
from streamrl.learner.batching import Sample, samples_from_group


@dataclass
class Batch:
    """One step's data as rank 0 prepared it (broadcast to every rank)."""

    version: int
    samples: list[Sample]
    # every entry taken off the stream for this step: (entry id, group id)
    entries: list[tuple[str, str]]
    log: dict
    # zero-variance groups' samples: not trained (their advantage is 0 and no KL or entropy term
    # is on) but counted by the loss normaliser, so skipping them saves compute without changing
    # the objective
    skipped: list[Sample] = field(default_factory=list)
    # the first exception of each reward function that failed on some of the step's samples
    reward_errors: dict[str, str] = field(default_factory=dict)


def _token_versions(group) -> list[np.ndarray]:
    return [c.versions.astype(np.int64) for c in group.completions]


def _wholly_stale(token_versions: list[np.ndarray], version: int, max_staleness: int) -> bool:
    return all(bool(is_stale(version, v, max_staleness).all()) for v in token_versions)


def has_signal(group, version: int, algo: AlgoConfig) -> bool:
    """Whether a group would be trained: not wholly stale and its rewards not all equal."""
    if _wholly_stale(_token_versions(group), version, algo.staleness_limit):
        return False
    rewards = group.rewards
    return bool(np.max(rewards) != np.min(rewards))


def dynamic_batch_size(signal: list[bool], need: int, cap: int) -> int | None:
    """How many of the buffered groups (``signal``: which carry one, in stream order) make the step.

    The shortest prefix holding ``need`` groups with a signal, or ``cap`` groups when
    none shorter does; None while the buffer is too short for either.
    """
    cap = max(cap, need)
    found = 0
    for i, s in enumerate(signal[:cap]):
        found += s
        if found == need:
            return i + 1
    return cap if len(signal) >= cap else None


def reward_failures_of(
    deliveries, names: Sequence[str] = ()
) -> tuple[dict[str, float], dict[str, str]]:
    """Each reward function's failure rate over every sample the step took (``names`` listed
    even at 0), and the first exception of each that failed (``broker.reward_failures``)."""
    total = sum(len(d.group.completions) for d in deliveries)
    counts: dict[str, int] = dict.fromkeys(names, 0)
    errors: dict[str, str] = {}
    for d in deliveries:
        failed, said = reward_failures.decode(d.group.meta)
        for name, n in failed.items():
            counts[name] = counts.get(name, 0) + n
        for name, error in said.items():
            errors.setdefault(name, error)
    rates = {name: min(1.0, n / total) if total else 0.0 for name, n in counts.items()}
    return rates, errors


@dataclass
class _Tally:
    """The step's groups sorted and counted, one ``add`` per delivered group."""

    samples: list[Sample] = field(default_factory=list)
    skipped: list[Sample] = field(default_factory=list)
    # every completion's reward, wholly stale groups left out
    rewards: list[float] = field(default_factory=list)
    # the token versions of each trained completion
    trained_versions: list[np.ndarray] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=dict)
    by_actor: dict[str, int] = field(default_factory=dict)
    # each group's reward std (TRL's: the sample std), and each completion's length and whether
    # it hit the token budget (finish_reason "length")
    group_stds: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    truncated: int = 0
    # completions that saw a weight swap between two of their tokens
    spanning: int = 0
    dropped_stale: int = 0
    # completion tokens of the wholly stale groups
    dropped_stale_tokens: int = 0
    zero_variance: int = 0

    def add(self, group, version: int, algo: AlgoConfig) -> None:
        """Drop the group (wholly stale), skip it (zero variance) or take it into the batch."""
        token_versions = _token_versions(group)
        if _wholly_stale(token_versions, version, algo.staleness_limit):
            self.dropped_stale += 1
            self.dropped_stale_tokens += sum(v.size for v in token_versions)
            return
        self._count(group)
        advantages, zero_var = algorithm.group_advantages(
            torch.tensor(group.rewards)[None], algo.advantage, algo.adv_eps, algo.std_threshold
        )
        # with a KL or entropy term a zero-advantage token still has a gradient: skipping it
        # would change the objective, so only dynamic sampling (DAPO's batch definition) drops it
        skippable = algo.skip_zero_variance and algo.kl_coef == 0 and algo.entropy_coef == 0
        if (skippable or algo.dynamic_sampling) and bool(zero_var[0]):
            self.zero_variance += 1
            if not algo.dynamic_sampling:
                self.skipped += samples_from_group(group, advantages[0].tolist())
            return
        self.samples += samples_from_group(group, advantages[0].tolist())
        self.trained_versions += token_versions

    def _count(self, group) -> None:
        """The figures of a group that is not wholly stale, trained or not."""
        rewards = [c.reward for c in group.completions]
        self.rewards += rewards
        if len(rewards) > 1:
            self.group_stds.append(float(np.std(rewards, ddof=1)))
        self.lengths += [len(c) for c in group.completions]
        self.truncated += sum(c.finish_reason == "length" for c in group.completions)
        for c in group.completions:
            for part, value in c.reward_parts.items():
                self.parts.setdefault(part, []).append(value)
        self.by_actor[group.actor_id] = self.by_actor.get(group.actor_id, 0) + 1
        self.spanning += sum(int(c.versions[0] != c.versions[-1]) for c in group.completions)


def completion_figures(lengths: list[int], truncated: int) -> dict[str, float]:
    """TRL's ``completions/*`` of a batch: mean, min and max length and the share clipped at the
    token budget (empty when the batch had no completion)."""
    if not lengths:
        return {}
    return {
        "mean_length": float(np.mean(lengths)),
        "min_length": float(min(lengths)),
        "max_length": float(max(lengths)),
        "clipped_ratio": truncated / len(lengths),
    }


def lag_histogram(staleness: np.ndarray) -> dict[str, int]:
    """Token count per version lag, keyed by the lag as a string (a JSON object's keys)."""
    lags, counts = np.unique(np.asarray(staleness, dtype=np.int64), return_counts=True)
    return {str(int(lag)): int(n) for lag, n in zip(lags, counts, strict=True)}


def prepare_batch(
    deliveries, version: int, algo: AlgoConfig, wait_s: float, reward_names: Sequence[str] = ()
) -> Batch:
    """Drop fully stale and zero-variance groups (counted), attach group advantages, and
    report each of ``reward_names``' failure rate.

    Under dynamic sampling the dropped zero-variance groups are not kept for the loss
    normaliser either: the batch is the groups with a signal, as DAPO defines it.
    """
    tally = _Tally()
    for d in deliveries:
        tally.add(d.group, version, algo)
    trained = tally.trained_versions
    versions = np.concatenate(trained) if trained else np.zeros(0, dtype=np.int64)
    staleness = algorithm.token_staleness(version, versions)
    stale_tokens = int(is_stale(version, versions, algo.staleness_limit).sum())
    masked, seen = (
        stale_tokens + tally.dropped_stale_tokens,
        versions.size + tally.dropped_stale_tokens,
    )
    adv_abs = float(np.mean([abs(s.advantage) for s in tally.samples])) if tally.samples else 0.0
    _observe(tally, staleness, stale_tokens, adv_abs)
    completions = completion_figures(tally.lengths, tally.truncated)
    reward_std = float(np.mean(tally.group_stds)) if tally.group_stds else math.nan
    _observe_completions(reward_std, completions)
    failure_rates, reward_errors = reward_failures_of(deliveries, reward_names)
    log = {
        "groups": len(deliveries),
        "reward_mean": float(np.mean(tally.rewards)) if tally.rewards else math.nan,
        # TRL's names: the mean over groups of the group's reward std; completion lengths in tokens
        # and the share that hit the token budget
        "reward_std": reward_std,
        "completions": completions,
        # the mean of each named reward part the task reports (its reward functions' names)
        "reward_parts": {name: float(np.mean(v)) for name, v in tally.parts.items()},
        # per reward function: the fraction of the step's samples it failed on (scored 0)
        "reward_failure_rate": failure_rates,
        "staleness_mean": float(staleness.mean()) if staleness.size else 0.0,
        "staleness_max": int(staleness.max()) if staleness.size else 0,
        # masked out of the loss: older than staleness_limit (wholly stale groups not included)
        "stale_tokens": stale_tokens,
        # tokens masked or dropped as stale, over the completion tokens of the groups read (those
        # skipped for zero variance left out)
        "stale_token_fraction": masked / seen if seen else 0.0,
        # the trained groups' tokens by version lag (learner version - sampling version)
        "staleness_hist": lag_histogram(staleness),
        "dropped_stale_groups": tally.dropped_stale,
        "zero_variance_groups": tally.zero_variance,
        "advantage_abs_mean": adv_abs,
        "wait_s": wait_s,
        "groups_by_actor": tally.by_actor,
        "version_spanning_completions": tally.spanning,
    }
    # multi-turn only: turns, tool calls and failures, step time, ends (broker.env_stats)
    if env := env_stats.summarize([(d.group.env, len(d.group.completions)) for d in deliveries]):
        log["env"] = env
    return Batch(
        version=version,
        samples=tally.samples,
        entries=[(d.entry_id, d.group.group_id) for d in deliveries],
        log=log,
        reward_errors=reward_errors,
        skipped=tally.skipped,
    )


def _observe_completions(reward_std: float, completions: dict[str, float]) -> None:
    if not math.isnan(reward_std):
        m.REWARD_STD.set(reward_std)
    if completions:
        m.COMPLETION_LENGTH.labels("mean").set(completions["mean_length"])
        m.COMPLETION_LENGTH.labels("max").set(completions["max_length"])
        m.COMPLETIONS_CLIPPED.set(completions["clipped_ratio"])


def _observe(tally: _Tally, staleness: np.ndarray, stale_tokens: int, adv_abs: float) -> None:
    """The step's figures on the metrics endpoint."""
    m.DROPPED_STALE_TOKENS.inc(stale_tokens + tally.dropped_stale_tokens)
    m.DROPPED_STALE_GROUPS.inc(tally.dropped_stale)
    m.ZERO_VARIANCE_GROUPS.inc(tally.zero_variance)
    m.observe_staleness(staleness)
    m.ADVANTAGE_ABS_MEAN.set(adv_abs)
    for r in tally.rewards:
        m.REWARD.observe(r)
