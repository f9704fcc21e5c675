"""The rollout-group wire format: one stream entry = one prompt and its G scored completions.

Defined once here; every producer and consumer goes through ``encode_group`` /
``decode_group``. msgpack with arrays as raw little-endian bytes (numpy
``tobytes`` is 15-30x faster than lists and 40% smaller). Nothing on this path
can execute data: msgpack only, no pickle, no ext types.

Layout (schema 2) is columnar: the G completions' tokens, log-probs and
versions (and, under ``algo.reference_on: actors``, the reference policy's log-probs, ``rlp``; for
multi-turn trajectories the loss mask, ``lm``: 1 for the model's tokens, 0 for the environment's)
travel as one array each plus a lengths array, so encoding is a few
concatenations and decoding validates every completion with a few numpy
reductions, then hands out views (schema 1, one map per completion, decoded
at a third of the speed).

A group of multi-turn trajectories also carries ``env``: what they did (turns, environment
step time, tool calls and failures, ends), summed over the group, in the fixed vocabulary of
``broker.env_stats``; single-turn entries have no ``env``.

Decoding validates everything and raises ``WireError`` with the reason; the
stream consumer turns that into a dead-letter entry.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import msgpack
import numpy as np

from streamrl.broker import env_stats
from streamrl.configs.errors import StreamRLError

SCHEMA_VERSION = 2
FINISH_REASONS = ("stop", "length", "abort")

TOKEN_DTYPE = np.dtype("<i4")
LOGPROB_DTYPE = np.dtype("<f4")
VERSION_DTYPE = np.dtype("<i4")
LENGTH_DTYPE = np.dtype("<i4")
MASK_DTYPE = np.dtype("u1")
REWARD_DTYPE = np.dtype("<f8")
# Bounds that keep a hostile entry from bloating what the learner keeps (ids live in the
# `trained` set for the run's life) or from reaching the loss with values no sampler produces.
MAX_ID_CHARS = 256
# what ids are made of: printable ASCII without spaces (actor ids, ``row<i>`` prompt ids,
# ``<actor>-<seq>-<hex>`` group ids). An empty id would be trained and enter the dedup set; a
# control character, a space or a newline would reach logs, metric labels and Redis keys
ID_PATTERN = re.compile(r"[!-~]+")
MAX_REWARD_PARTS = 32
MAX_PART_NAME_CHARS = 64
MAX_META_KEYS = 16
MAX_META_CHARS = 256
# The lowest log-prob a sampled token can have: a sampler in float32 (or bfloat16, same
# exponent range) cannot draw a token whose probability is below the smallest normal float32.
# Lower behaviour log-probs only come from a forged entry and overflow exp() in the IS ratio.
MIN_LOGPROB = float(np.log(np.finfo(np.float32).tiny))
# reference log-probs are the frozen model's for a token it did not sample: far lower is real,
# but below this the KL term's exp/log-ratio overflow the loss
MIN_REF_LOGPROB = -1000.0
# what a step row reports a group's mean reward as (learner.target), so no part may take it
RESERVED_PART_NAMES = frozenset({"reward"})


class WireError(StreamRLError, ValueError):
    """An entry that is not a valid rollout group; the message says why."""


@dataclass(slots=True)
class Completion:
    # [T] int32, the sampled tokens (stop token included)
    token_ids: np.ndarray
    # [T] float32, behaviour log-prob of each sampled token (after temperature/top-p/top-k)
    logprobs: np.ndarray
    # [T] int32, policy version that sampled each token (non-decreasing)
    versions: np.ndarray
    reward: float
    finish_reason: str = "stop"
    reward_parts: dict[str, float] = field(default_factory=dict)
    # [T] float32, the frozen initial policy's log-prob of each token (``algo.reference_on:
    # actors``), else None
    ref_logprobs: np.ndarray | None = None
    # [T] uint8, 1 where the model sampled the token, 0 where the environment appended it (its
    # log-prob is 0 and its version that of the model token before it); None = all the model's
    loss_mask: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass
class RolloutGroup:
    # unique; a redelivered entry is recognised by it
    group_id: str
    prompt_id: str
    actor_id: str
    # per-actor sequence number
    seq: int
    # [P] int32
    prompt_token_ids: np.ndarray
    completions: list[Completion]
    # unix seconds when the group was scored
    created_at: float = 0.0
    meta: dict[str, float | int | str] = field(default_factory=dict)
    # multi-turn: what the trajectories did, summed over the group (broker.env_stats); {} = none
    env: dict[str, float] = field(default_factory=dict)

    @property
    def rewards(self) -> np.ndarray:
        return np.array([c.reward for c in self.completions], dtype=np.float64)


def encode_group(group: RolloutGroup) -> bytes:
    """Serialise a group. Arrays are cast to the wire dtypes; log-probs are clamped to <= 0."""
    comps = group.completions
    if not comps:
        raise WireError(f"group {group.group_id!r} has no completions")
    logprobs = _logprob_column([c.logprobs for c in comps])
    with_ref = [c.ref_logprobs is not None for c in comps]
    if any(with_ref) and not all(with_ref):
        raise WireError(f"group {group.group_id!r}: reference log-probs on some completions only")
    parts = [{str(k): float(v) for k, v in c.reward_parts.items()} for c in comps]
    payload = {
        "v": SCHEMA_VERSION,
        "gid": group.group_id,
        "pid": group.prompt_id,
        "aid": group.actor_id,
        "seq": int(group.seq),
        "t": float(group.created_at),
        "prompt": np.ascontiguousarray(group.prompt_token_ids, dtype=TOKEN_DTYPE).tobytes(),
        "meta": dict(group.meta),
        "len": np.array([len(c.token_ids) for c in comps], dtype=LENGTH_DTYPE).tobytes(),
        "tok": np.concatenate(
            [c.token_ids for c in comps], dtype=TOKEN_DTYPE, casting="same_kind"
        ).tobytes(),
        "lp": logprobs.tobytes(),
        "ver": np.concatenate(
            [c.versions for c in comps], dtype=VERSION_DTYPE, casting="same_kind"
        ).tobytes(),
        "r": np.array([c.reward for c in comps], dtype=REWARD_DTYPE).tobytes(),
        "fin": [c.finish_reason for c in comps],
        # [] = no completion has named parts
        "rp": parts if any(parts) else [],
    }
    if group.env:
        if why := env_stats.problem(group.env, len(comps)):
            raise WireError(f"group {group.group_id!r}.env: {why}")
        payload["env"] = {k: float(v) if k == "step_s" else int(v) for k, v in group.env.items()}
    if all(with_ref):
        payload["rlp"] = _logprob_column([c.ref_logprobs for c in comps]).tobytes()
    if any(c.loss_mask is not None for c in comps):
        payload["lm"] = np.concatenate(
            [np.ones(len(c), MASK_DTYPE) if c.loss_mask is None else c.loss_mask for c in comps],
            dtype=MASK_DTYPE,
            casting="unsafe",
        ).tobytes()
    return msgpack.packb(payload, use_bin_type=True)


def _logprob_column(columns: list[np.ndarray]) -> np.ndarray:
    """The wire's log-prob column: float32, clamped to <= 0 (float error can put a log-prob above)."""
    logprobs = np.concatenate(columns, dtype=LOGPROB_DTYPE, casting="same_kind")
    return np.minimum(logprobs, 0.0, out=logprobs)


def _field(obj: dict, key: str, kind: type | tuple[type, ...], where: str):
    if key not in obj:
        raise WireError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise WireError(f"{where}.{key}: expected {names}, got {type(value).__name__}")
    return value


def _id(obj: dict, key: str) -> str:
    value = _field(obj, key, str, "group")
    if len(value) > MAX_ID_CHARS:
        raise WireError(f"group.{key}: {len(value)} characters (at most {MAX_ID_CHARS})")
    if not ID_PATTERN.fullmatch(value):
        raise WireError(
            f"group.{key}: {value[:64]!r} is not a non-empty id of printable ASCII without spaces"
        )
    return value


def _array(obj: dict, key: str, dtype: np.dtype) -> np.ndarray:
    raw = _field(obj, key, bytes, "group")
    if len(raw) % dtype.itemsize:
        raise WireError(
            f"group.{key}: {len(raw)} bytes is not a whole number of {dtype.itemsize}-byte items"
        )
    return np.frombuffer(raw, dtype=dtype)


def _owner(bad: np.ndarray, offsets: np.ndarray) -> str:
    """Name of the completion that holds the first True of ``bad`` (a mask over all tokens)."""
    return f"completion[{int(np.searchsorted(offsets, int(np.argmax(bad)), side='right')) - 1}]"


def decode_group(
    data: bytes, vocab_size: int | None = None, max_bytes: int = 64 << 20
) -> RolloutGroup:
    """Parse and validate one entry. Raises ``WireError`` with the reason for anything invalid."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"entry payload must be bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise WireError(f"entry of {len(data)} bytes exceeds the size limit of {max_bytes}")
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_bytes,
            max_str_len=1 << 20,
            max_array_len=1 << 16,
            max_map_len=1 << 12,
            max_ext_len=0,
        )
    # msgpack raises several unrelated types for garbage
    except Exception as exc:
        raise WireError(f"not valid msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, dict):
        raise WireError(f"top level must be a map, got {type(obj).__name__}")
    version = obj.get("v")
    if version != SCHEMA_VERSION:
        raise WireError(f"unknown schema version {version!r} (this build reads {SCHEMA_VERSION})")
    prompt = _array(obj, "prompt", TOKEN_DTYPE)
    if prompt.size == 0:
        raise WireError("group.prompt: empty prompt")
    if prompt.min() < 0 or (vocab_size is not None and prompt.max() >= vocab_size):
        raise WireError(f"group.prompt: token id outside the vocabulary [0, {vocab_size})")
    created_at = _field(obj, "t", (float, int), "group")
    if not math.isfinite(created_at) or created_at < 0:
        raise WireError(f"group.t: created_at {created_at!r} is not a finite time")
    meta = obj.get("meta", {})
    if not isinstance(meta, dict) or not all(
        isinstance(v, (int, float, str)) for v in meta.values()
    ):
        raise WireError("group.meta: expected a map of scalars")
    for key, value in meta.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise WireError(f"group.meta[{str(key)[:64]!r}]: non-finite value {value!r}")
    if len(meta) > MAX_META_KEYS or any(
        len(k) > MAX_META_CHARS or isinstance(v, str) and len(v) > MAX_META_CHARS
        for k, v in meta.items()
    ):
        raise WireError(
            f"group.meta: at most {MAX_META_KEYS} entries of at most {MAX_META_CHARS} characters"
        )
    completions = _completions(obj, vocab_size)
    env = obj.get("env", {})
    if not isinstance(env, dict):
        raise WireError(f"group.env: expected a map, got {type(env).__name__}")
    if env and (why := env_stats.problem(env, len(completions))):
        raise WireError(f"group.env: {why}")
    return RolloutGroup(
        group_id=_id(obj, "gid"),
        prompt_id=_id(obj, "pid"),
        actor_id=_id(obj, "aid"),
        seq=_field(obj, "seq", int, "group"),
        prompt_token_ids=prompt,
        completions=completions,
        created_at=float(created_at),
        meta=meta,
        env=env,
    )


def _completions(obj: dict, vocab_size: int | None) -> list[Completion]:
    """Validate the columns of all completions with a few reductions, then hand out views.
    Only a failing entry pays for locating the culprit."""
    offsets = _offsets(_array(obj, "len", LENGTH_DTYPE))
    n, total = offsets.size - 1, int(offsets[-1])
    tokens = _array(obj, "tok", TOKEN_DTYPE)
    logprobs = _array(obj, "lp", LOGPROB_DTYPE)
    versions = _array(obj, "ver", VERSION_DTYPE)
    rewards = _array(obj, "r", REWARD_DTYPE)
    _check_sizes(tokens, logprobs, versions, rewards, n, total)
    _check_tokens(tokens, offsets, vocab_size)
    _check_logprobs(logprobs, "lp", offsets, MIN_LOGPROB)
    ref_logprobs = _ref_logprobs(obj, total, offsets) if "rlp" in obj else None
    loss_mask = _loss_mask(obj, total, offsets) if "lm" in obj else None
    _check_versions(versions, offsets)
    _check_rewards(rewards)
    finish = _finish_reasons(obj, n)
    parts = _reward_parts(obj, n)
    bounds = offsets.tolist()
    rewards_list = rewards.tolist()
    return [
        Completion(
            tokens[bounds[i] : bounds[i + 1]],
            logprobs[bounds[i] : bounds[i + 1]],
            versions[bounds[i] : bounds[i + 1]],
            rewards_list[i],
            finish[i],
            parts[i],
            None if ref_logprobs is None else ref_logprobs[bounds[i] : bounds[i + 1]],
            None if loss_mask is None else loss_mask[bounds[i] : bounds[i + 1]],
        )
        for i in range(n)
    ]


def _offsets(lengths: np.ndarray) -> np.ndarray:
    """[n + 1] int64: where each completion starts in the token columns, then the total."""
    if lengths.size == 0:
        raise WireError("group: no completions")
    if lengths.min() <= 0:
        raise WireError(f"completion[{int(np.argmax(lengths <= 0))}]: empty completion")
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _check_sizes(
    tokens: np.ndarray,
    logprobs: np.ndarray,
    versions: np.ndarray,
    rewards: np.ndarray,
    n: int,
    total: int,
) -> None:
    if not tokens.size == logprobs.size == versions.size == total:
        raise WireError(
            f"group: lengths differ (completion lengths sum to {total}; tokens {tokens.size}, "
            f"logprobs {logprobs.size}, versions {versions.size})"
        )
    if rewards.size != n:
        raise WireError(f"group.r: {rewards.size} rewards for {n} completions")


def _check_tokens(tokens: np.ndarray, offsets: np.ndarray, vocab_size: int | None) -> None:
    if tokens.min() < 0 or (vocab_size is not None and tokens.max() >= vocab_size):
        bad = tokens < 0 if vocab_size is None else (tokens < 0) | (tokens >= vocab_size)
        raise WireError(
            f"{_owner(bad, offsets)}.tok: token id outside the vocabulary [0, {vocab_size})"
        )


def _ref_logprobs(obj: dict, total: int, offsets: np.ndarray) -> np.ndarray:
    """The ``rlp`` column: one reference log-prob per token, each one a frozen model can give."""
    ref_logprobs = _array(obj, "rlp", LOGPROB_DTYPE)
    if ref_logprobs.size != total:
        raise WireError(f"group.rlp: {ref_logprobs.size} reference log-probs for {total} tokens")
    _check_logprobs(ref_logprobs, "rlp", offsets, MIN_REF_LOGPROB)
    return ref_logprobs


def _check_versions(versions: np.ndarray, offsets: np.ndarray) -> None:
    if versions.min() < 0:
        raise WireError(f"{_owner(versions < 0, offsets)}.ver: negative policy version")
    # versions[t+1] < versions[t] inside a completion; steps across a boundary don't count.
    steps = np.diff(versions)
    steps[offsets[1:-1] - 1] = 0
    if steps.size and steps.min() < 0:
        bad = np.concatenate(([False], steps < 0))
        raise WireError(
            f"{_owner(bad, offsets)}.ver: policy versions go backwards within a completion"
        )


def _check_rewards(rewards: np.ndarray) -> None:
    if not np.isfinite(rewards).all():
        i = int(np.argmax(~np.isfinite(rewards)))
        raise WireError(f"completion[{i}].r: non-finite reward {float(rewards[i])!r}")


def _finish_reasons(obj: dict, n: int) -> list[str]:
    finish = _field(obj, "fin", list, "group")
    if len(finish) != n:
        raise WireError(f"group.fin: {len(finish)} finish reasons for {n} completions")
    for i, reason in enumerate(finish):
        if reason not in FINISH_REASONS:
            raise WireError(f"completion[{i}].fin: unknown finish reason {reason!r}")
    return finish


def _reward_parts(obj: dict, n: int) -> list[dict[str, float]]:
    """The ``rp`` column: each completion's named reward parts (``[]`` on the wire: none has)."""
    parts = _field(obj, "rp", list, "group")
    if not parts:
        return [{} for _ in range(n)]
    if len(parts) != n:
        raise WireError(f"group.rp: {len(parts)} reward-part maps for {n} completions")
    if not _all_finite_parts(parts):
        i = next(i for i, p in enumerate(parts) if not _all_finite_parts([p]))
        raise WireError(f"completion[{i}].rp: expected a map of finite numbers")
    for i, p in enumerate(parts):
        _check_part_names(p, f"completion[{i}].rp")
    return parts


def _loss_mask(obj: dict, total: int, offsets: np.ndarray) -> np.ndarray:
    """The ``lm`` column: one 0/1 per token, and every completion has a token the model sampled."""
    mask = _array(obj, "lm", MASK_DTYPE)
    if mask.size != total:
        raise WireError(f"group.lm: {mask.size} loss-mask values for {total} tokens")
    if mask.max() > 1:
        raise WireError(f"{_owner(mask > 1, offsets)}.lm: loss-mask value other than 0 or 1")
    model_tokens = np.add.reduceat(mask.astype(np.int64), offsets[:-1])
    if model_tokens.min() == 0:
        raise WireError(f"completion[{int(np.argmin(model_tokens))}].lm: no token of the model")
    return mask


def _check_logprobs(logprobs: np.ndarray, key: str, offsets: np.ndarray, lowest: float) -> None:
    # NaN fails both comparisons
    if not (logprobs.min() >= lowest and logprobs.max() <= 0):
        bad = ~np.isfinite(logprobs)
        if bad.any():
            raise WireError(f"{_owner(bad, offsets)}.{key}: non-finite log-prob")
        if (logprobs > 0).any():
            raise WireError(f"{_owner(logprobs > 0, offsets)}.{key}: log-prob above 0")
        low = logprobs < lowest
        raise WireError(
            f"{_owner(low, offsets)}.{key}: log-prob {float(logprobs[np.argmax(low)])!r} below "
            f"{lowest:.4g}, which no sampler produces"
        )


def _check_part_names(parts: dict, where: str) -> None:
    if len(parts) > MAX_REWARD_PARTS:
        raise WireError(f"{where}: {len(parts)} reward parts (at most {MAX_REWARD_PARTS})")
    for name in parts:
        if len(name) > MAX_PART_NAME_CHARS:
            raise WireError(
                f"{where}: a reward-part name of {len(name)} characters "
                f"(at most {MAX_PART_NAME_CHARS})"
            )
        if name in RESERVED_PART_NAMES:
            raise WireError(
                f"{where}: reward part {name!r} is reserved (the mean reward is reported as it)"
            )


def _all_finite_parts(parts: list) -> bool:
    """Every element is a map of str -> finite int/float (one flat pass over all completions)."""
    if not all(type(p) is dict for p in parts):
        return False
    if not all(type(k) is str for p in parts for k in p):
        return False
    values = [v for p in parts for v in p.values()]
    return all(type(v) in (int, float) for v in values) and all(map(math.isfinite, values))
