"""The featurizer's decisions, without I/O: one micro-batch of requests in, deltas out.

``featurize_batch`` takes the raw ``requests`` messages of ONE partition (ascending offsets), a
read-only view of that partition's feature cache and an encoder (the frozen backbones), and
returns a :class:`BatchOutcome`:

- one exact :class:`~schemas.delta_codec.Delta` per head touched (entries: adds with class
  labels, adds with vector labels, deletes with class labels, deletes with vector labels;
  ROWS, or PACKED ledgers in federated mode),
- dead letters (with reason codes, see :data:`FEATURIZER_REASONS`) and rejected receipts for
  deletes the featurizer refuses,
- the cache mutations (net effect of the batch) and the last input offset covered.

Nothing here touches Kafka or sqlite; ``services/featurizer.py`` applies the outcome through the
transactional outbox of ``services/feature_cache.py`` (docs/featurizer.md). Events are judged
sequentially against an in-memory overlay of the cache, so "add x, delete x" in one batch works
and a duplicate add within a batch is caught. Exact integer sums commute, so grouping the rows
by (sign, label kind) gives the same ledger as the event order.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import orjson

from unlearn.ledger import ExactLedger, Quantizer, QuantizationError, l2_normalize
from unlearn.ledger.exact import MAX_CLASS_INDEX
from unlearn.schemas.deadletter import DeadLetter, encode_deadletter
from unlearn.schemas.delta_codec import Delta, PackedEntry, RowsEntry, encode_delta
from unlearn.schemas.source_id import format_source_id, parse_source, source_stream
from unlearn.schemas.envelope import (
    ID_MAX_CHARS,
    REQUEST_REASONS,
    FeaturesInput,
    ImageInput,
    InvalidRequest,
    Request,
    TextInput,
    parse_request,
)
from unlearn.schemas.receipts import Receipt, encode_receipt
from unlearn.features.backbones import BackboneError, EncodeResult, backbone_cache_key, backbone_info
from unlearn.features.contract import FeatureRejected, quantize_feature_row, quantizer

__all__ = [
    "DEFAULT_BACKBONES",
    "FEATURIZER_REASONS",
    "STAGE",
    "BatchOutcome",
    "CacheMutations",
    "CacheView",
    "CachedSample",
    "CoreConfig",
    "Encoder",
    "HeadInfo",
    "InMessage",
    "OutMessage",
    "RegistryEncoder",
    "Rejected",
    "featurize_batch",
    "format_source_id",
    "parse_source",
    "parse_source_id",
    "quantize_feature_row",
    "source_stream",
]

STAGE = "featurizer"
"""``stage`` of every dead letter this service writes."""

DEFAULT_BACKBONES: dict[str, str] = {"features": "features", "text": "minilm", "image": "efficientnet-lite0"}
"""Backbone per input kind when ``UNLEARN_HEAD_BACKBONES`` names none for the head."""

FEATURIZER_REASONS: dict[str, str] = {
    **{k: f"request envelope: {v}" for k, v in REQUEST_REASONS.items()},
    "duplicate_add": "an add for a (head, sample) already in the feature cache (never a double count)",
    "unknown_sample": "a delete for a (head, sample) not in the feature cache",
    "unknown_subject": "a delete_subject for a subject with no cached sample in that head",
    "subject_mismatch": "a delete whose subject_id differs from the subject that added the sample",
    "wrong_client": "federated mode: the request's client_id is not this site's client",
    "dimension_mismatch": "the feature dimension differs from the head's (fixed by its first add)",
    "dimension_too_large": "a new head's dimension exceeds UNLEARN_MAX_FEATURE_DIM",
    "backbone_mismatch": "the input kind/backbone differs from the head's, or the head's configured "
                         "backbone does not take this input kind",
    "backbone_unavailable": "the backbone cannot be loaded (unknown name, package or weights missing)",
    "undecodable_input": "the backbone refused the input (corrupt image, empty text, ...)",
    "encode_failed": "the backbone raised on this input while the rest of its batch encoded",
    "non_finite_feature": "a feature (or its L2 norm) is NaN or infinite",
    "feature_out_of_bound": "a feature component exceeds UNLEARN_FEATURE_BOUND (never clipped)",
    "label_out_of_range": "a class index > 2^20-1, a label vector too wide, or a quantized target "
                          "beyond 2^30",
    "label_mismatch": "class-index vs vector label, or another vector width, than the head's first add",
    "soft_label_needs_label_frac_bits": "non-integer label values while UNLEARN_LABEL_FRAC_BITS=0",
}
"""Every reason code the featurizer writes to ``deadletter`` (and rejected receipts)."""

_DELETE_OPS = ("delete", "delete_subject")


# --------------------------------------------------------------------------- source ids
def parse_source_id(source_id: str) -> tuple[int, int] | None:
    """``"requests/<partition>@<offset>"`` (any stream name) -> (partition, offset); None if the
    string does not follow the convention. Use :func:`parse_source` when the stream matters
    (federated sites use their own stream names)."""
    parsed = parse_source(source_id)
    return None if parsed is None else (parsed[1], parsed[2])


# --------------------------------------------------------------------------- data types
@dataclass(frozen=True, slots=True)
class InMessage:
    """One consumed ``requests`` message."""

    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None


@dataclass(frozen=True, slots=True)
class HeadInfo:
    """What the featurizer fixes per head at its first accepted add."""

    head_id: str
    backbone: str  # backbone cache key, e.g. "features", "minilm", "efficientnet-lite0@112px"
    input_kind: str  # features | text | image
    dim: int
    label_kind: Literal["class", "vector"]
    label_width: int  # c of vector labels; 0 for class indices
    frac_bits: int
    label_frac_bits: int


@dataclass(frozen=True, slots=True, eq=False)
class CachedSample:
    """A cached added sample: the exact q (and label) its delete must reuse."""

    head_id: str
    sample_id: str
    subject_id: str
    client_id: str
    event_id: str  # the add's event id
    label: int | np.ndarray  # class index, or int64 quantized target vector (c,)
    q: np.ndarray  # int64 (d,)

    @property
    def label_kind(self) -> str:
        return "class" if isinstance(self.label, int) else "vector"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CachedSample):
            return NotImplemented
        same_label = (
            self.label == other.label
            if isinstance(self.label, int) and isinstance(other.label, int)
            else (not isinstance(self.label, int) and not isinstance(other.label, int)
                  and np.array_equal(self.label, other.label))
        )
        return (
            (self.head_id, self.sample_id, self.subject_id, self.client_id, self.event_id)
            == (other.head_id, other.sample_id, other.subject_id, other.client_id, other.event_id)
            and same_label
            and np.array_equal(self.q, other.q)
        )

    __hash__ = None  # type: ignore[assignment]


class CacheView(Protocol):
    """Read side of the feature cache (``FeatureCache`` implements it)."""

    def get_sample(self, head_id: str, sample_id: str) -> CachedSample | None: ...

    def subject_samples(self, head_id: str, subject_id: str) -> list[CachedSample]: ...

    def get_head(self, head_id: str) -> HeadInfo | None: ...


@dataclass(frozen=True)
class CacheMutations:
    """Net effect of a batch on the cache (apply all in one transaction)."""

    put_samples: tuple[CachedSample, ...] = ()
    drop_samples: tuple[tuple[str, str], ...] = ()  # (head_id, sample_id)
    put_heads: tuple[HeadInfo, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.put_samples or self.drop_samples or self.put_heads)


@dataclass(frozen=True, slots=True)
class OutMessage:
    """A message to produce (an outbox row before it has a sequence number)."""

    topic: str
    key: bytes | None
    value: bytes


Encoder = Callable[[str, Sequence[Any]], EncodeResult]
"""``encoder(backbone_name, items) -> EncodeResult`` (per-item errors, like
``Backbone.encode_checked``); raises ``BackboneError`` with ``index=None`` when the backbone
cannot be loaded. Only text and image inputs reach it: feature vectors are passed through here
in float64."""


class RegistryEncoder:
    """The production encoder: ``services.backbones.get_backbone(name, device)``, cached."""

    def __init__(self, device: str = "auto") -> None:
        self.device = device

    def __call__(self, name: str, items: Sequence[Any]) -> EncodeResult:
        from unlearn.features.backbones import get_backbone

        try:
            backbone = get_backbone(name, self.device)
        except BackboneError:
            raise
        except (ImportError, OSError, RuntimeError) as exc:  # package/weights missing, bad device
            raise BackboneError(f"cannot load backbone {name!r}: {type(exc).__name__}: {exc}") from exc
        return backbone.encode_checked(items)


@dataclass(frozen=True)
class CoreConfig:
    """Everything ``featurize_batch`` needs besides the data (built from Settings by the shell)."""

    requests_topic: str
    deltas_topic: str
    deadletter_topic: str
    receipts_topic: str
    stream: str = "requests"
    frac_bits: int = 30
    label_frac_bits: int = 0
    feature_bound: float = 1.0
    normalize: bool = True
    max_dim: int = 2048
    head_backbones: Mapping[str, str] = field(default_factory=dict)
    federated: bool = False
    client_id: str | None = None
    max_message_bytes: int = 100_000_000

    def __post_init__(self) -> None:
        if self.federated and not self.client_id:
            raise ValueError("federated mode needs a client_id (the data owner this site serves)")
        Quantizer(self.frac_bits, self.feature_bound)  # raises on an impossible grid

    @classmethod
    def from_settings(cls, settings: Any, *, requests_topic: str | None = None, federated: bool = False,
                      client_id: str | None = None) -> "CoreConfig":
        """From ``infra.settings.Settings`` (``requests_topic`` default: ``<prefix>requests``)."""
        topic = requests_topic or settings.topic("requests")
        overrides = {}
        for item in filter(None, (p.strip() for p in settings.head_backbones.split(","))):
            name, _, value = item.partition("=")
            overrides[name.strip()] = value.strip()
        return cls(
            requests_topic=topic,
            deltas_topic=settings.topic("deltas"),
            deadletter_topic=settings.topic("deadletter"),
            receipts_topic=settings.topic("receipts"),
            stream=source_stream(topic, settings.topic_prefix, client_id if federated else None),
            frac_bits=settings.frac_bits,
            label_frac_bits=settings.label_frac_bits,
            feature_bound=settings.feature_bound,
            normalize=settings.normalize_features,
            max_dim=settings.max_feature_dim,
            head_backbones=overrides,
            federated=federated,
            client_id=client_id if federated else None,
            max_message_bytes=settings.max_message_bytes,
        )


@dataclass
class BatchOutcome:
    """What one micro-batch of one partition decided."""

    partition: int
    last_offset: int
    deltas: list[Delta]
    deadletters: list[DeadLetter]
    receipts: list[Receipt]
    mutations: CacheMutations
    accepted: int = 0  # events that became rows
    rows: int = 0  # rows over all deltas (a delete_subject may give many)

    def reasons(self) -> dict[str, int]:
        """Dead-letter reason -> count (for logs and tests)."""
        out: dict[str, int] = {}
        for d in self.deadletters:
            out[d.reason] = out.get(d.reason, 0) + 1
        return out

    def messages(self, config: CoreConfig) -> list[OutMessage]:
        """Encoded messages, in produce order: deltas, dead letters, receipts."""
        out = [OutMessage(config.deltas_topic, d.head_id.encode(), encode_delta(d)) for d in self.deltas]
        out += [
            OutMessage(config.deadletter_topic, d.key if d.key is not None else STAGE.encode(),
                       _encode_deadletter_bounded(d, config.max_message_bytes))
            for d in self.deadletters
        ]
        out += [OutMessage(config.receipts_topic, r.subject_id.encode(), encode_receipt(r)) for r in self.receipts]
        return out


# --------------------------------------------------------------------------- quantization
# The featurizer's refusals share the feature contract's error type (one reason-code carrier).
Rejected = FeatureRejected


def _label_value(label: int | tuple[float, ...], label_frac_bits: int) -> tuple[str, int, int | np.ndarray]:
    """(kind, width, value): a class index, or the int64 quantized target vector."""
    if isinstance(label, int):
        if not 0 <= label <= MAX_CLASS_INDEX:
            raise Rejected("label_out_of_range", f"class index {label} exceeds {MAX_CLASS_INDEX}")
        return "class", 0, int(label)
    y = np.asarray(label, dtype=np.float64)
    if y.size > MAX_CLASS_INDEX + 1:
        raise Rejected("label_out_of_range", f"label vector of {y.size} values is wider than {MAX_CLASS_INDEX + 1}")
    if label_frac_bits == 0 and not np.all(y == np.rint(y)):
        raise Rejected("soft_label_needs_label_frac_bits",
                      "label vector has non-integer values; set UNLEARN_LABEL_FRAC_BITS > 0 to quantize them")
    try:
        qy = quantizer(label_frac_bits, float(2 ** (30 - label_frac_bits))).quantize(y)[0]
    except QuantizationError as exc:
        raise Rejected("label_out_of_range", f"label vector: {exc}") from None
    return "vector", int(qy.shape[0]), qy


def _fixed_dim(backbone_key: str) -> int | None:
    if backbone_key.startswith("features:"):
        return int(backbone_key.split(":", 1)[1])
    try:
        return backbone_info(backbone_key.split("@", 1)[0]).dim
    except BackboneError:
        return None


# --------------------------------------------------------------------------- overlay
class _Overlay:
    """The cache as seen after the events of this batch judged so far."""

    def __init__(self, base: CacheView) -> None:
        self.base = base
        self.samples: dict[tuple[str, str], CachedSample | None] = {}
        self.heads: dict[str, HeadInfo] = {}

    def get_sample(self, head_id: str, sample_id: str) -> CachedSample | None:
        key = (head_id, sample_id)
        if key in self.samples:
            return self.samples[key]
        return self.base.get_sample(head_id, sample_id)

    def subject_samples(self, head_id: str, subject_id: str) -> list[CachedSample]:
        found: dict[str, CachedSample] = {}
        for cs in self.base.subject_samples(head_id, subject_id):
            if (head_id, cs.sample_id) not in self.samples:
                found[cs.sample_id] = cs
        for (h, s), cs in self.samples.items():
            if h == head_id and cs is not None and cs.subject_id == subject_id:
                found[s] = cs
        return [found[s] for s in sorted(found)]

    def get_head(self, head_id: str) -> HeadInfo | None:
        return self.heads.get(head_id) or self.base.get_head(head_id)

    def mutations(self) -> CacheMutations:
        return CacheMutations(
            put_samples=tuple(v for v in self.samples.values() if v is not None),
            drop_samples=tuple(k for k, v in self.samples.items() if v is None),
            put_heads=tuple(self.heads.values()),
        )


class _HeadRows:
    """Rows of one head in one batch, in the four entry groups."""

    def __init__(self) -> None:
        self.groups: dict[tuple[int, str], list[tuple[str, CachedSample]]] = {
            (1, "class"): [], (1, "vector"): [], (-1, "class"): [], (-1, "vector"): [],
        }

    def add(self, sign: int, event_id: str, cs: CachedSample) -> None:
        self.groups[(sign, cs.label_kind)].append((event_id, cs))


# --------------------------------------------------------------------------- the batch
def featurize_batch(
    messages: Sequence[InMessage],
    cache: CacheView,
    config: CoreConfig,
    encoder: Encoder | None = None,
    *,
    now: float | None = None,
) -> BatchOutcome:
    """Judge one micro-batch of ONE requests partition against ``cache`` (read only).

    Returns the deltas, dead letters, rejected receipts and cache mutations; raises only for
    programming errors (messages of several partitions, offsets not ascending) or a backbone
    failure that hits every input of its group (a systemic failure: the worker should stop and
    be restarted rather than dead-letter everything)."""
    if not messages:
        raise ValueError("featurize_batch needs at least one message")
    partition = messages[0].partition
    prev = -1
    for m in messages:
        if m.partition != partition:
            raise ValueError(f"one partition per batch: got {partition} and {m.partition}")
        if m.offset <= prev:
            raise ValueError(f"offsets must ascend: {m.offset} after {prev}")
        prev = m.offset
    ts = time.time() if now is None else float(now)
    encoder = encoder or RegistryEncoder("auto")

    # Phase 1: parse.
    reqs: list[Request | InvalidRequest] = []
    for m in messages:
        try:
            reqs.append(parse_request(m.value))  # type: ignore[arg-type]
        except InvalidRequest as exc:
            reqs.append(exc)

    # Phase 2: encode every add's input, batched per backbone (state-independent).
    feats: dict[int, np.ndarray | Rejected] = {}
    backbone_of: dict[int, str] = {}
    groups: dict[str, list[tuple[int, Any]]] = {}
    for i, r in enumerate(reqs):
        if not isinstance(r, Request) or r.op != "add" or r.input is None:
            continue
        if config.federated and r.client_id != config.client_id:
            continue  # rejected in phase 3; never encode another owner's data
        try:
            name, key = _resolve_backbone(config, r.head_id, r.input.kind)
        except Rejected as rej:
            feats[i] = rej
            continue
        backbone_of[i] = key
        if isinstance(r.input, FeaturesInput):
            feats[i] = np.asarray(r.input.values, dtype=np.float64)
        elif isinstance(r.input, TextInput):
            groups.setdefault(name, []).append((i, r.input.text))
        elif isinstance(r.input, ImageInput):
            groups.setdefault(name, []).append((i, r.input.data))
    for name, items in groups.items():
        for (i, _), res in zip(items, _encode_group(encoder, name, [p for _, p in items])):
            feats[i] = res

    # Phase 3: judge sequentially against the overlay.
    overlay = _Overlay(cache)
    rows: dict[str, _HeadRows] = {}
    deadletters: list[DeadLetter] = []
    receipts: list[Receipt] = []
    accepted = 0

    def reject(m: InMessage, r: Request | None, reason: str, detail: str, raw_ids: dict[str, Any] | None = None) -> None:
        deadletters.append(DeadLetter(
            original=bytes(m.value) if m.value is not None else b"",
            reason=reason, detail=detail, stage=STAGE, topic=config.requests_topic,
            partition=m.partition, offset=m.offset, key=m.key,
            event_id=r.event_id if r is not None else (raw_ids or {}).get("event_id"), ts=ts,
        ))
        ids = raw_ids if r is None else {
            "op": r.op, "event_id": r.event_id, "subject_id": r.subject_id, "head_id": r.head_id,
            "sample_ids": [r.sample_id] if r.sample_id else [],
        }
        if ids and ids.get("op") in _DELETE_OPS:
            receipts.append(Receipt.rejected(ids["event_id"], ids["subject_id"], ids["head_id"],
                                             ids["sample_ids"], reason, ts))

    for i, (m, r) in enumerate(zip(messages, reqs)):
        if isinstance(r, InvalidRequest):
            reject(m, None, r.reason, r.detail, _salvage_delete_ids(m.value))
            continue
        if config.federated and r.client_id != config.client_id:
            reject(m, r, "wrong_client",
                   f"this federated featurizer serves client {config.client_id!r}, not {r.client_id!r}")
            continue
        try:
            if r.op == "add":
                cs, head, new_head = _judge_add(r, feats.get(i), backbone_of.get(i), overlay, config)
                if new_head:
                    overlay.heads[head.head_id] = head
                overlay.samples[(r.head_id, r.sample_id)] = cs  # type: ignore[index]
                rows.setdefault(r.head_id, _HeadRows()).add(+1, r.event_id, cs)
            elif r.op == "delete":
                cs = overlay.get_sample(r.head_id, r.sample_id)  # type: ignore[arg-type]
                if cs is None:
                    raise Rejected("unknown_sample", f"sample {r.sample_id!r} of head {r.head_id!r} is not in the feature cache")
                if cs.subject_id != r.subject_id:
                    raise Rejected("subject_mismatch",
                                  f"sample {r.sample_id!r} was added by another subject than {r.subject_id!r}")
                overlay.samples[(r.head_id, cs.sample_id)] = None
                rows.setdefault(r.head_id, _HeadRows()).add(-1, r.event_id, cs)
            else:  # delete_subject
                found = overlay.subject_samples(r.head_id, r.subject_id)
                if not found:
                    raise Rejected("unknown_subject",
                                  f"subject {r.subject_id!r} has no cached sample in head {r.head_id!r}")
                hr = rows.setdefault(r.head_id, _HeadRows())
                for cs in found:
                    overlay.samples[(r.head_id, cs.sample_id)] = None
                    hr.add(-1, r.event_id, cs)
        except Rejected as rej:
            reject(m, r, rej.reason, rej.detail)
            continue
        accepted += 1

    deltas: list[Delta] = []
    source_id = format_source_id(partition, messages[-1].offset, config.stream)
    n_rows = 0
    for head_id, hr in rows.items():
        head = overlay.get_head(head_id)
        assert head is not None, f"rows for head {head_id!r} without head info"
        n_head = sum(len(items) for items in hr.groups.values())
        # Rows cost n*(d+c)*8 bytes, a packed ledger ~12*d^2 whatever n: a head whose rows would
        # not fit comfortably in one message goes packed (the ledger accepts both, same digest).
        rows_bytes = n_head * (head.dim + max(1, head.label_width)) * 8
        packed = config.federated or rows_bytes > config.max_message_bytes // 2
        entries = []
        for (sign, _kind), items in hr.groups.items():
            if not items:
                continue
            entries.append(_entry(sign, items, head, packed))
            n_rows += len(items)
        deltas.append(Delta(head_id, source_id, head.dim, head.frac_bits, head.label_frac_bits, tuple(entries)))
    return BatchOutcome(partition, messages[-1].offset, deltas, deadletters, receipts, overlay.mutations(),
                        accepted=accepted, rows=n_rows)


def _encode_deadletter_bounded(d: DeadLetter, max_bytes: int) -> bytes:
    """The record's JSON; a huge original (base64 grows it by 4/3) is truncated, and the detail
    says so, rather than failing delivery forever."""
    value = encode_deadletter(d)
    if len(value) <= max_bytes:
        return value
    keep = max(0, max_bytes // 2 - len(d.detail) - 4096)
    short = DeadLetter(d.original[:keep], d.reason,
                       f"{d.detail} [original truncated from {len(d.original)} to {keep} bytes]",
                       d.stage, d.topic, d.partition, d.offset, d.key, d.event_id, d.ts)
    return encode_deadletter(short)


def _resolve_backbone(config: CoreConfig, head_id: str, input_kind: str) -> tuple[str, str]:
    """(registry name, cache key) of a head's backbone for an input of ``input_kind``."""
    name = config.head_backbones.get(head_id) or DEFAULT_BACKBONES[input_kind]
    try:
        info = backbone_info(name)
        key = backbone_cache_key(name)
    except BackboneError as exc:
        raise Rejected("backbone_unavailable", f"head {head_id!r}: {exc}") from None
    if info.kind != input_kind:
        raise Rejected("backbone_mismatch",
                      f"head {head_id!r} uses backbone {key!r} ({info.kind} inputs), got a {input_kind} input")
    return name, key


def _encode_group(encoder: Encoder, name: str, items: list[Any]) -> list[np.ndarray | Rejected]:
    """Encode items with one backbone; per-item rejects for bad inputs. A non-BackboneError from
    the model (a crash on one odd input, or an out-of-memory on the whole batch) is retried item
    by item to isolate the culprit; if every item still fails, it is systemic: re-raise."""
    try:
        res = encoder(name, items)
    except BackboneError as exc:
        if exc.index is None:
            return [Rejected("backbone_unavailable", str(exc))] * len(items)
        raise
    except Exception as exc:
        if len(items) == 1:
            raise
        out: list[np.ndarray | Rejected] = []
        for item in items:
            try:
                out.extend(_encode_group(encoder, name, [item]))
            except Exception as inner:
                out.append(Rejected("encode_failed", f"{name}: {type(inner).__name__}: {inner}"))
        if all(isinstance(o, Rejected) and o.reason == "encode_failed" for o in out):
            raise exc
        return out
    out = [Rejected("undecodable_input", f"{name}: no output for this input")] * len(items)
    for j, idx in enumerate(res.indices.tolist()):
        out[idx] = np.asarray(res.features[j], dtype=np.float64)
    for idx, err in res.errors.items():
        out[idx] = Rejected("undecodable_input", f"{name}: {err.reason}")
    return out


def _judge_add(r: Request, feat: np.ndarray | Rejected | None, backbone_key: str | None, overlay: _Overlay,
               config: CoreConfig) -> tuple[CachedSample, HeadInfo, bool]:
    assert r.sample_id is not None and r.input is not None and r.label is not None
    if overlay.get_sample(r.head_id, r.sample_id) is not None:
        raise Rejected("duplicate_add", f"sample {r.sample_id!r} of head {r.head_id!r} is already in the feature cache")
    if isinstance(feat, Rejected):
        raise feat
    if feat is None or backbone_key is None:
        raise Rejected("undecodable_input", "no features were produced for this input")
    dim = int(feat.shape[0])
    head = overlay.get_head(r.head_id)
    if head is not None:
        if head.backbone != backbone_key or head.input_kind != r.input.kind:
            raise Rejected("backbone_mismatch",
                          f"head {r.head_id!r} uses {head.backbone!r} on {head.input_kind} inputs; this add "
                          f"resolves to {backbone_key!r} on a {r.input.kind} input")
        if dim != head.dim:
            raise Rejected("dimension_mismatch", f"head {r.head_id!r} has d={head.dim}, this add has {dim} features")
        k, k_y = head.frac_bits, head.label_frac_bits
    else:
        fixed = _fixed_dim(backbone_key)
        if fixed is not None and dim != fixed:
            raise Rejected("dimension_mismatch", f"backbone {backbone_key!r} has d={fixed}, this add has {dim} features")
        if dim > config.max_dim:
            raise Rejected("dimension_too_large",
                          f"d={dim} exceeds UNLEARN_MAX_FEATURE_DIM={config.max_dim} for new head {r.head_id!r}")
        k, k_y = config.frac_bits, config.label_frac_bits
    kind, width, label = _label_value(r.label, k_y)
    if head is not None and (kind != head.label_kind or width != head.label_width):
        what = "class indices" if head.label_kind == "class" else f"label vectors of width {head.label_width}"
        got = "a class index" if kind == "class" else f"a label vector of width {width}"
        raise Rejected("label_mismatch", f"head {r.head_id!r} takes {what}, got {got}")
    q = quantize_feature_row(feat, k, config.feature_bound, config.normalize)
    new_head = head is None
    if head is None:
        head = HeadInfo(r.head_id, backbone_key, r.input.kind, dim, kind, width, k, k_y)  # type: ignore[arg-type]
    cs = CachedSample(r.head_id, r.sample_id, r.subject_id, r.client_id, r.event_id, label, q)
    return cs, head, new_head


def _entry(sign: int, items: list[tuple[str, CachedSample]], head: HeadInfo, packed: bool) -> RowsEntry | PackedEntry:
    event_ids = tuple(e for e, _ in items)
    sample_ids = tuple(cs.sample_id for _, cs in items)
    subject_ids = tuple(cs.subject_id for _, cs in items)
    Q = np.stack([cs.q for _, cs in items]).astype(np.int64, copy=False)
    if items[0][1].label_kind == "class":
        labels = np.asarray([cs.label for _, cs in items], dtype=np.int64)
    else:
        labels = np.stack([cs.label for _, cs in items]).astype(np.int64, copy=False)  # type: ignore[misc]
    if not packed:
        return RowsEntry(sign, event_ids, sample_ids, subject_ids, labels, Q)
    blob = ExactLedger.from_rows(Q, labels, frac_bits=head.frac_bits, label_frac_bits=head.label_frac_bits).to_bytes()
    return PackedEntry(sign, event_ids, sample_ids, subject_ids, blob)


def _salvage_delete_ids(raw: bytes | None) -> dict[str, Any] | None:
    """For an invalid request that still names a delete with usable ids: the receipt fields, so the
    client that asked is told it was rejected. None otherwise."""
    if raw is None:
        return None
    try:
        d = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        return None
    if type(d) is not dict or d.get("op") not in _DELETE_OPS:
        return None

    def ok(v: object) -> bool:
        return type(v) is str and 1 <= len(v) <= ID_MAX_CHARS

    if not all(ok(d.get(k)) for k in ("event_id", "subject_id", "head_id")):
        return None
    sample = d.get("sample_id")
    return {
        "op": d["op"], "event_id": d["event_id"], "subject_id": d["subject_id"], "head_id": d["head_id"],
        "sample_ids": [sample] if ok(sample) else [],
    }
