"""The broker's metrics, defined once: the rollout stream's length, pending entries and what this
process produced, consumed, dead-lettered, redelivered, skipped as duplicate or lost to the cap
(``stream`` counts them). The endpoint that serves them is ``runtime.metrics_endpoint``'s."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

STREAM_LENGTH = Gauge(
    "streamrl_stream_length", "Entries in the rollout stream (produced, not yet acked)."
)
STREAM_PENDING = Gauge(
    "streamrl_stream_pending", "Entries delivered to a learner consumer and not yet acked."
)
STREAM_PRODUCED = Counter(
    "streamrl_stream_produced_total", "Groups XADDed to the rollout stream by this process."
)
STREAM_CONSUMED = Counter(
    "streamrl_stream_consumed_total",
    "Entries taken off the stream for the first time by this process (valid, dead or duplicate).",
)
STREAM_DEAD_LETTER = Counter(
    "streamrl_stream_dead_letter_total", "Undecodable entries moved to the dead-letter stream."
)
STREAM_REDELIVERED = Counter(
    "streamrl_stream_redelivered_total",
    "Entries delivered again: own pending on start, or claimed from an idle consumer.",
)
STREAM_DUPLICATES = Counter(
    "streamrl_stream_duplicates_total",
    "Entries skipped because their group was already trained or is in flight.",
)
STREAM_TRIMMED = Counter(
    "streamrl_stream_trimmed_total",
    "Unacked entries removed by the MAXLEN safety cap (lost to the learner).",
)
