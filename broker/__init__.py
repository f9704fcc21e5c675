"""broker: everything that lives in Redis, and the wire format that travels through it.

Owns the embedded Redis server (``server``), key naming (``keys``), the
rollout-group wire format (``wire``) and the limits a valid group must also
keep (``semantics``), the crash-safe stream producer/consumer
with dead-lettering and redelivery (``stream``), the shared admission-control
counters and policy version (``admission``), actor heartbeats (``liveness``)
the Prometheus endpoint helper (``metrics``), the reward failures a group reports in its
meta (``reward_failures``), what a group's multi-turn trajectories did (``env_stats``) and the start-up phase log that learner and actors write for
``bench.startup``, and the CPU pinning they apply once started (``startup``).

Talks to: Redis only. May import: ``configs``. Must not import ``actors``,
``learner`` or ``weightsync``.
"""
