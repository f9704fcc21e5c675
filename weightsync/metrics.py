"""Prometheus metrics of the weight path (names in docs/architecture.md); defined once per process."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

PUBLISH_SECONDS = Histogram(
    "streamrl_weights_publish_seconds",
    "Wall time of one publish, from the learner's submit to the announcement (conversion, staging copy, shm write or broadcast).",
    buckets=_SECONDS,
)
STAGE_SECONDS = Histogram(
    "streamrl_weights_stage_seconds",
    "Time the learner spends in one publish: the staging copy, with any wait for a free buffer (the rest runs in the background).",
    buckets=_SECONDS,
)
STAGE_WAITS = Counter(
    "streamrl_weights_stage_waits_total",
    "Publishes that found their staging buffer still being written out (the learner waits; how long: ..._stage_wait_seconds).",
)
STAGE_WAIT_SECONDS = Histogram(
    "streamrl_weights_stage_wait_seconds",
    "Time the learner waited for a staging buffer whose previous version was still being written out.",
    buckets=_SECONDS,
)
PUBLISH_BYTES = Counter(
    "streamrl_weights_publish_bytes_total", "Bytes written by the publisher (one copy per version)."
)
PUBLISHED_VERSION = Gauge(
    "streamrl_weights_published_version", "Newest version this publisher announced."
)
RECEIVE_SECONDS = Histogram(
    "streamrl_weights_receive_seconds",
    "Wall time for a subscriber to receive one version into its staging copy.",
    buckets=_SECONDS,
)
TRANSFER_FAILURES = Counter(
    "streamrl_weights_transfer_failures_total",
    "Transfers that failed or were given up, by reason (torn, stale_slot, lease_timeout, timeout, peer_dropped, error, engine_push).",
    ["reason"],
)
RELAY_BYTES = Counter(
    "streamrl_weights_relay_bytes_total",
    "Bytes a host relay received from the learner's dist group (one model per version, however many actors its host runs).",
)
RELAY_VERSIONS = Counter(
    "streamrl_weights_relay_versions_total",
    "Versions a host relay received and served to its host.",
)
REFUSED = Counter(
    "streamrl_weights_refused_total",
    "Values the dist transport refused to act on, by kind (unsigned, forged, malformed, no_secret, group, heartbeat): a header or member list in the learner's store it did not sign, or a record in Redis that does not parse.",
    ["kind"],
)
