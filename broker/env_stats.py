"""What a group's multi-turn trajectories did, as the learner reads it: the wire's ``env`` map.

The actor rolls out, the learner reports; this is the contract between them. Per group, summed
over its G trajectories (each a count, but ``step_s``):

- ``turns``: model turns;
- ``steps``, ``step_s``: environment ``step`` calls and the seconds they took;
- ``tool_calls``: ``<tool_call>`` blocks the model wrote; ``tool_failed/<reason>``: those that
  failed, by ``TOOL_FAILURES`` reason;
- ``end/<reason>``: trajectories by why they ended (``END_REASONS``), one each.

Only these keys are valid (``broker.wire`` rejects any other, a count that is not a whole
number, and ends that do not add up to the group's completions), so a hostile entry can neither
grow the learner's step rows nor divide by zero there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

# why a trajectory ended: the environment said done, a limit, or a failed call
END_REASONS = ("done", "max_turns", "max_total_tokens", "length", "error", "timeout", "invalid")
# why a tool call failed: its block was not {name, arguments} JSON (the actor parses it), the
# tool does not exist or refused the arguments (the environment says), or the tool raised
TOOL_FAILURES = ("parse", "unknown_tool", "bad_arguments", "raised")
END = "end/"
TOOL_FAILED = "tool_failed/"
COUNTS = (
    "turns",
    "steps",
    "tool_calls",
    *(TOOL_FAILED + r for r in TOOL_FAILURES),
    *(END + r for r in END_REASONS),
)
KEYS = frozenset((*COUNTS, "step_s"))
# far above any real group's count; a forged one larger is refused
MAX_COUNT = 2**31 - 1


def problem(stats: Mapping, completions: int) -> str | None:
    """Why ``stats`` is not a valid ``env`` map of a group of ``completions``; None if it is."""
    for key, value in stats.items():
        if key not in KEYS:
            return f"unknown key {str(key)[:64]!r}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{key}: expected a number, got {type(value).__name__}"
        if not math.isfinite(value) or value < 0:
            return f"{key}: {value!r} is not a finite number >= 0"
        if key != "step_s" and (value != int(value) or value > MAX_COUNT):
            return f"{key}: {value!r} is not a whole count up to {MAX_COUNT}"
    ends = sum(stats.get(END + r, 0) for r in END_REASONS)
    if ends != completions:
        return f"ends add up to {ends:g}, the group has {completions} completions"
    return None


def summarize(groups: Sequence[tuple[Mapping[str, float], int]]) -> dict[str, float]:
    """The step row's ``env`` entry from (``env`` map, completions) per multi-turn group: per
    trajectory, the mean turns and tool calls, each tool failure reason's calls, and the fraction
    of each end; ``step_s``: the mean seconds of an environment step (every reason and end listed,
    even at 0, so each is one unbroken series). Empty when no group is multi-turn."""
    trajectories = sum(n for stats, n in groups if stats)
    if not trajectories:
        return {}
    total = {key: sum(float(stats.get(key, 0)) for stats, _ in groups) for key in KEYS}
    return {
        "turns": total["turns"] / trajectories,
        "tool_calls": total["tool_calls"] / trajectories,
        **{TOOL_FAILED + r: total[TOOL_FAILED + r] / trajectories for r in TOOL_FAILURES},
        "step_s": total["step_s"] / total["steps"] if total["steps"] else 0.0,
        **{END + r: total[END + r] / trajectories for r in END_REASONS},
    }
