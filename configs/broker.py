"""Redis (``broker``): the embedded server or an external one, the rollout stream and its consumer
group."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from streamrl.configs.section import Section


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
    port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Port of the embedded Redis. None = 6379 for `streamrl broker` (the port other hosts `--join redis://HOST:6379/0`), a free one for `streamrl run` (one host: nothing else needs to know it); 0 = a free one always. A port in use fails at start naming broker.port.",
    )
    password: str | None = Field(
        None,
        json_schema_extra={"secret": True},
        description="requirepass for the embedded Redis (None = a random one per run, kept in the 0600 URL file); mandatory for a non-loopback bind. Every command refuses it on the command line (visible in `ps`): `streamrl broker`, `streamrl run` and every `--join` read STREAMRL_REDIS_PASSWORD, else `password_file`, else this key of a config file.",
    )
    password_file: str | None = Field(
        None,
        description="File holding the Redis password on its first line, for `streamrl broker`, `streamrl run` and every `--join` when STREAMRL_REDIS_PASSWORD is unset; refused unless only its owner may read it (mode 0600 or stricter).",
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
        description="PEM CA bundle clients verify the broker's certificate with (hostname checked too: the certificate must name the host in the URL); `streamrl broker` also puts it in the URL it prints (`?ssl_ca_certs=`). None = the system's CAs.",
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
