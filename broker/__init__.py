"""broker: everything that lives in Redis, and the wire format that travels through it.

Owns the embedded Redis server (``server``), key naming (``keys``), the
rollout-group wire format (``wire``) and the limits a valid group must also
keep (``semantics``), the crash-safe stream producer/consumer
with dead-lettering and redelivery (``stream``), the shared admission-control
counters and policy version (``admission``), actor heartbeats (``liveness``),
the stream's metrics (``metrics``), the reward failures a group reports in its
meta (``reward_failures``) and what a group's multi-turn trajectories did (``env_stats``).
What every process does around its own job (its metrics endpoint, logs, start-up phases, CPU
pinning) is ``runtime``'s.

Talks to: Redis only. May import: ``configs``. Must not import ``actors``,
``learner``, ``weightsync`` or ``runtime``.
"""
