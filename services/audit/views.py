"""What the audit pages show, read from the topics with the readers the other tools use.

- a subject: ``erasure_report`` per head (its receipts, the samples its deltas name and the
  check of every store), plus the subject's refused requests from ``deadletter`` (a redacted dead
  letter keeps the envelope: head, subject, sample, op) and refused deletes (``rejected`` receipts);
  which samples the head retains now is the verifier's log-order replay of the head's deltas
  (the erasure report's ``retained_now``), never a rule of this module: a sample deleted and
  re-added later (in
  event time: remove wins, docs/featurizer.md) is retained again;
- a head: every update still on the heads family (``verifier.reading``), its applied receipts,
  its contract (``common.registry``); the certificate is the verifier's (``verify_broker``);
- the index: the latest heads (``head_reader.read_heads``) and the deletes seen in ``requests``,
  ``requests.by-head`` or ``deltas`` that no receipt answers yet.

Blocking (Kafka reads): the app calls these in a worker thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from unlearn.common.families import heads_family
from unlearn.common.registry import read_contracts
from unlearn.infra.settings import Settings
from unlearn.runtime.topic_reader import LogRecord, TopicReadError, read_topic
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.schemas.delta_codec import decode_delta
from unlearn.schemas.envelope import parse_request
from unlearn.schemas.head import HeadUpdate
from unlearn.schemas.receipts import Receipt
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.services.client.head_reader import read_heads
from unlearn.services.erasure.report import ErasureReport, erasure_report
from unlearn.services.verifier.errors import VerifyError
from unlearn.services.verifier.reading import (
    decode_receipts,
    live_updates,
    read_head_records,
    read_head_updates,
    read_receipt_records,
)

__all__ = ["HeadView", "IndexView", "PendingDelete", "Refusal", "SampleFact", "SubjectHead", "head_view", "index_view",
           "pending_removals", "sample_facts", "subject_refusals", "subject_view"]


@dataclass
class SampleFact:
    """One sample of the subject in one head: its state now, ``retained``, ``deleted`` (with its
    receipt), ``not retained`` (no applied receipt names it yet) or ``refused`` (never taken); ``receipt``
    of a retained sample is the applied delete it was re-added after (``readded``)."""

    sample_id: str
    state: str  # "retained" | "deleted" | "not retained" (no applied receipt names it yet) | "refused"
    receipt: dict[str, Any] | None = None
    reason: str | None = None
    readded: bool = False


@dataclass
class SubjectHead:
    """A subject's facts in one head: samples, every receipt, and the erasure report."""

    head_id: str
    samples: list[SampleFact]
    report: ErasureReport


@dataclass
class Refusal:
    """A refused request of the subject, from its dead letter."""

    head_id: str
    sample_id: str | None
    op: str
    reason: str
    ts: float


def subject_view(settings: Settings, subject_id: str, timeout: float) -> list[SubjectHead]:
    """Per head that knows the subject (a sample in its deltas, a receipt or a dead letter): the
    subject's samples and their states now, and the erasure report of that head."""
    refusals = subject_refusals(settings, subject_id, timeout)
    heads = sorted(set(read_heads(settings, timeout=timeout)) | {r.head_id for r in refusals})
    out = []
    for head in heads:
        rep = erasure_report(settings, head, subject_id, timeout)
        refused = [r for r in refusals if r.head_id == head]
        if rep.samples or rep.receipts or refused:
            out.append(SubjectHead(head, sample_facts(rep, refused, set(rep.retained_now)), rep))
    return out


def sample_facts(rep: ErasureReport, refused: list[Refusal], retained: set[str]) -> list[SampleFact]:
    """Each sample's state now: ``retained`` when the head retains it (the report's ``retained_now``;
    ``readded`` with the latest applied receipt naming it when it was deleted before), else
    ``deleted`` with the latest applied receipt naming it (``not retained`` while none does: the
    receipt is not written yet, or the ledger refused the add); a refused add
    of a deleted sample (a re-add dated before its delete) is its ``reason``; then the refused adds
    of samples the head never took (a refused delete is a ``rejected`` receipt, listed with the
    receipts)."""
    applied: dict[str, dict[str, Any]] = {}
    for rc in sorted((rc for rc in rep.receipts if rc["status"] == "applied"),
                     key=lambda rc: (rc["head_version"] or 0, rc.get("ts") or 0.0)):
        for s in rc["sample_ids"]:
            applied[s] = rc  # the latest delete of the sample
    facts = []
    for s in sorted(rep.samples):
        if s in retained:
            facts.append(SampleFact(s, "retained", applied.get(s), readded=s in applied))
            continue
        why = [f"{r.op}: {r.reason}" for r in refused if r.sample_id == s and r.op == "add"]
        facts.append(SampleFact(s, "deleted" if s in applied else "not retained", applied.get(s),
                                "; ".join(why) or None))
    facts += [SampleFact(r.sample_id or "(none)", "refused", reason=f"{r.op}: {r.reason}")
              for r in refused if r.op not in ("delete", "delete_subject") and r.sample_id not in rep.samples]
    return facts


def subject_refusals(settings: Settings, subject_id: str, timeout: float) -> list[Refusal]:
    """The subject's dead letters whose original is a readable envelope (plaintext or redacted;
    one sealed under a sample key names no subject in clear and cannot be attributed)."""
    out = []
    for r in read_topic(settings, settings.topic("deadletter"), None, timeout, role="verifier"):
        try:
            dl = decode_deadletter(r.value or b"")
            env = orjson.loads(dl.original)
        except (CodecError, ValueError, orjson.JSONDecodeError):
            continue
        if isinstance(env, dict) and env.get("subject_id") == subject_id and isinstance(env.get("head_id"), str):
            sample = env.get("sample_id")
            out.append(Refusal(env["head_id"], sample if isinstance(sample, str) else None, str(env.get("op")),
                               dl.reason, dl.ts))
    return out


@dataclass
class HeadView:
    """One head: its updates in log order, the live one, applied receipts and the contract."""

    head_id: str
    updates: list[HeadUpdate]
    live: HeadUpdate | None
    receipts: list[Receipt]
    contract: dict[str, Any] | None
    undecodable: int = 0


def head_view(settings: Settings, head_id: str, timeout: float) -> HeadView:
    """The head's history as the heads family still holds it (Kafka compacts it: older versions
    may be gone), its receipts and its latest contract."""
    try:
        recs = read_head_records(settings, heads_family(settings.topic_prefix), head_id, timeout)
        updates, bad = read_head_updates(recs, head_id)
        receipts = decode_receipts(read_receipt_records(settings, head_id, timeout))
    except VerifyError as exc:
        raise TopicReadError(str(exc)) from None
    contract = read_contracts(settings, timeout).get(head_id)
    live, _ = live_updates(updates)
    return HeadView(head_id, sorted(updates, key=lambda u: (u.version, u.mode == "exact")), live, receipts,
                    contract.to_dict() if contract is not None else None, bad)


@dataclass
class PendingDelete:
    """A delete received (in ``requests``/``requests.by-head``, or already a ``deltas`` removal)
    that no receipt answers yet; ``received_ts`` is its event time, else its record's time."""

    event_id: str
    head_id: str
    subject_id: str
    op: str
    sample_id: str | None
    received_ts: float
    where: str

    def age(self, now: float) -> float:
        return max(0.0, now - self.received_ts)


@dataclass
class IndexView:
    heads: dict[str, HeadUpdate]
    pending: list[PendingDelete] = field(default_factory=list)
    now: float = field(default_factory=time.time)


def index_view(settings: Settings, timeout: float) -> IndexView:
    """The latest heads and the unanswered deletes, oldest first."""
    heads = read_heads(settings, timeout=timeout)
    answered = {rc.event_id for rc in decode_receipts(
        read_topic(settings, settings.topic("receipts"), None, timeout, role="verifier"))}
    pending: dict[str, PendingDelete] = {}
    for name in ("requests", "requests.by-head"):
        for r in read_topic(settings, settings.topic(name), None, timeout, role="verifier"):
            p = _pending_request(r, name)
            if p is not None and p.event_id not in answered:
                pending.setdefault(p.event_id, p)
    for r in read_topic(settings, settings.topic("deltas"), None, timeout, role="verifier"):
        for p in pending_removals(r):
            if p.event_id not in answered:
                pending.setdefault(p.event_id, p)
    return IndexView(heads, sorted(pending.values(), key=lambda p: (p.received_ts, p.event_id)))


def _pending_request(r: LogRecord, where: str) -> PendingDelete | None:
    if not r.value:
        return None
    try:
        req = parse_request(r.value)
    except InvalidRequest:
        return None
    if req.op == "add":
        return None
    ts = req.ts if req.ts is not None else r.timestamp_ms / 1000
    return PendingDelete(req.event_id, req.head_id, req.subject_id, req.op, req.sample_id, ts, where)


def pending_removals(r: LogRecord) -> list[PendingDelete]:
    """The removals in a ``deltas`` record, one per row, dated by the row's event time (else the
    record's): the featurizer took the delete over, the ledger has not answered it yet."""
    try:
        d = decode_delta(r.value or b"")
    except CodecError:
        return []
    out = []
    for e in d.entries:
        if e.sign >= 0:
            continue
        for i, ev in enumerate(e.event_ids):
            ts = e.event_us[i] / 1e6 if i < len(e.event_us) and e.event_us[i] else r.timestamp_ms / 1000
            op = "delete_subject" if e.by_subject else "delete"
            out.append(PendingDelete(ev, d.head_id, e.subject_ids[i], op, e.sample_ids[i], ts, "deltas"))
    return out
