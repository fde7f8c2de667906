"""``unlearn erasure-report --head H --subject S [--json]``: can any of a subject's data still be read?

For one subject of one head (docs/erasure.md): its delete receipts, the samples the head retains
now (the verifier's log-order replay: a sample re-added after its delete is retained again), the
head version that first excluded all of its samples (none while one is retained), and a check of
every store the system controls:

- ``subject-keys``: the newest generation of each partition holds no key of the subject's samples
  and every older generation is deleted (a key record written and later tombstoned is still in
  that generation's log until the topic is deleted): waited for up to the retire grace + 10 s,
  since deletes of other subjects keep rotating the family;
- ``transit-private``: every superseded generation is deleted (it may still hold a destroyed
  transit key, which opens raw inputs sealed under it); the newest generations name the transit
  keys that still exist;
- the local sqlite feature caches under ``UNLEARN_DATA_DIR`` (this host): no row of the subject;
- ``deltas``: every row of the subject is sealed (no plaintext ROWS entry of it) under a key that
  no longer exists;
- ``featurizer-cache``: no plaintext sample record of the subject (a sealed record names no subject
  in clear), every sealed one under a destroyed key;
- ``deadletter``: no readable original request of the subject (one sealed under a sample key
  names no subject in clear; a refused add sealed for transit is clear once its transit key is gone;
  one whose plaintext input was redacted, ``schemas/redaction.py``, is clear), nor a refused delta
  kept as sent (UNLEARN_DEADLETTER_INPUTS=keep) with plaintext rows of the subject
  (``redaction.readable_delta``; a redacted one is a summary of ids);
- ``requests`` and ``requests.by-head`` (read in full): no add of the subject whose raw input can
  still be read: plaintext (a plain producer, or UNLEARN_TRANSIT_SEAL=off) is never clear, a
  sealed one is clear once its transit key is destroyed (docs/erasure.md section 5);
- the ``cdc.*`` change topics of `unlearn cdc` (docs/cdc.md, "Erasure"), read in full: no change
  record whose old or new row has a column equal to the subject id (a change record names no head,
  so any table's row of the subject counts): `unlearn cdc` trims what it has forwarded.

Exit 0 only if every check is clear; 1 otherwise (or when a topic cannot be read), 2 for usage.
On a secured cluster it runs as the ``verifier`` principal (docs/security.md).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from unlearn.common.families import keys_family, transit_private_family
from unlearn.common.key_ring import COMPLETE_KEY, KeysUnavailable, parse_key_record_key, superseded_left
from unlearn.infra.cli_args import NO_BROKER, add_broker_args, cli_exit_code, settings_from_args, settings_help
from unlearn.infra.settings import ErasureSettings, Settings
from unlearn.runtime import clients
from unlearn.runtime.topic_family import TopicFamily
from unlearn.runtime.topic_reader import LogRecord, TopicReadError, keys_in, read_topic
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.schemas.delta_codec import RowsEntry, SealedRowsEntry, decode_delta
from unlearn.schemas.envelope import parse_request
from unlearn.schemas.receipts import decode_receipt
from unlearn.schemas.redaction import is_redacted, readable_delta
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.schemas.request_inputs import SealedInput
from unlearn.services.verifier.erasure import open_records
from unlearn.services.verifier.errors import VerifyError
from unlearn.services.verifier.reading import read_head_records
from unlearn.services.verifier.replay import replay_log
from unlearn.streams.ledger.row_opener import RowOpener

__all__ = ["ErasureReport", "erasure_report", "erasure_report_main"]


@dataclass
class StoreCheck:
    store: str
    clear: bool
    detail: str
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"store": self.store, "clear": self.clear, "detail": self.detail, "problems": self.problems[:50]}


@dataclass
class ErasureReport:
    head_id: str
    subject_id: str
    receipts: list[dict[str, Any]] = field(default_factory=list)
    excluded_from_version: int | None = None
    samples: dict[str, list[str]] = field(default_factory=dict)  # sample -> key ids seen
    retained_now: list[str] = field(default_factory=list)  # of ``samples``: re-added after a delete
    checks: list[StoreCheck] = field(default_factory=list)

    @property
    def clear(self) -> bool:
        return bool(self.receipts) and all(c.clear for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"head_id": self.head_id, "subject_id": self.subject_id, "clear": self.clear,
                "receipts": self.receipts, "excluded_from_version": self.excluded_from_version,
                "samples": self.samples, "retained_now": self.retained_now,
                "checks": [c.to_json() for c in self.checks]}

    def summary(self) -> str:
        lines = [f"erasure of subject {self.subject_id!r} in head {self.head_id!r}: "
                 + ("CLEAR" if self.clear else "NOT CLEAR"),
                 f"  applied delete receipts: {sum(r['status'] == 'applied' for r in self.receipts)}"
                 f" (of {len(self.receipts)}); head version first excluding every sample: "
                 f"{self.excluded_from_version}",
                 f"  samples seen: {len(self.samples)}"
                 + (f"; retained now (re-added after a delete, or never deleted): {len(self.retained_now)}"
                    if self.retained_now else "")]
        for c in self.checks:
            lines.append(f"  [{'ok' if c.clear else 'FAIL'}] {c.store}: {c.detail}")
            lines += [f"      {p}" for p in c.problems[:3]]
        return "\n".join(lines)


def _read(settings: Settings, topic: Any, timeout: float, keep: Any = None) -> list[LogRecord]:
    return read_topic(settings, topic, keep, timeout, role="verifier")


def _all_topics(settings: Settings) -> list[str]:


    return list(clients.admin(settings).list_topics(timeout=settings.admin_timeout).topics)


def erasure_report(settings: Settings, head_id: str, subject_id: str, timeout: float = 60.0) -> ErasureReport:
    rep = ErasureReport(head_id, subject_id)
    _read_receipts(settings, rep, timeout)
    plain, sealed_refs = _scan_deltas(settings, rep, timeout)
    deleted = {s for rc in rep.receipts if rc["status"] == "applied" for s in rc["sample_ids"]}
    versions = [int(rc["head_version"]) for rc in rep.receipts if rc["status"] == "applied" and rc["head_version"]]
    if rep.samples:
        rep.retained_now = sorted(retained_samples(settings, head_id, timeout) & set(rep.samples))
    # A sample re-added after its delete is in the head again: no version excludes every sample.
    if rep.samples and set(rep.samples) <= deleted and versions and not rep.retained_now:
        rep.excluded_from_version = max(versions)
    transit_kids = _check_keys(settings, rep, plain, sealed_refs, timeout)
    _check_inputs(settings, rep, transit_kids, timeout)
    rep.checks.append(_check_change_topics(settings, subject_id, timeout))
    rep.checks.append(_check_caches(settings, head_id, subject_id))
    return rep


def retained_samples(settings: Settings, head_id: str, timeout: float) -> set[str]:
    """The sample ids the head's whole ``deltas`` log retains, as the verifier finds them: its
    deltas opened with the key family (a row whose key is destroyed is erased, so it is not
    retained) and replayed in log order with the live ledger's rules (``replay_log``); a sample is
    retained when an applied add of it is left that no applied delete removed. Remove wins was
    judged by the featurizer before the rows were written: an add dated at or before a delete was
    refused and never reached ``deltas``, a later one is a re-add and did."""
    try:
        recs = read_head_records(settings, settings.topic("deltas"), head_id, timeout)
        opened, erased = open_records(recs, head_id, RowOpener(settings, batch=True, role="verifier"))
    except VerifyError as exc:
        raise TopicReadError(str(exc)) from None
    except KeysUnavailable as exc:
        raise TopicReadError(f"cannot read the sample keys: {exc}") from None
    replay = replay_log(opened, head_id, created_at=erased.sealed_adds)
    return {a.sample_id for a in replay.times.retained()}



def _check_change_topics(settings: Settings, subject_id: str, timeout: float) -> StoreCheck:
    """Debezium change records (``<prefix>cdc.<schema>.<table>``) that still hold a row of the subject."""
    topics = sorted(t for t in _all_topics(settings) if t.startswith(settings.topic("cdc.")))
    if not topics:
        return StoreCheck("cdc change topics", True, "no change topic")
    needle = orjson.dumps(subject_id)
    found = []
    for t in topics:
        for r in _read(settings, t, timeout):
            if not r.value or needle not in r.value:
                continue
            try:
                payload = orjson.loads(r.value).get("payload") or {}
            except (orjson.JSONDecodeError, AttributeError):
                found.append(f"{t} {r.partition}/{r.offset}: unparsable record naming the subject")
                continue
            rows: list[dict[str, Any]] = [x for k in ("before", "after") if isinstance(x := payload.get(k), dict)]
            if any(v == subject_id for row in rows for v in row.values()):
                found.append(f"{t} {r.partition}/{r.offset}: a row of the subject")
    return StoreCheck("cdc change topics", not found, f"{len(topics)} change topics, no row of the subject"
                      if not found else f"{len(found)} change records hold rows of the subject", found)


def _read_receipts(settings: Settings, rep: ErasureReport, timeout: float) -> None:
    """The subject's receipts for the head, into ``rep.receipts``."""
    head_id, subject_id = rep.head_id, rep.subject_id
    # receipts are keyed by subject
    for r in _read(settings, settings.topic("receipts"), timeout, keys_in([subject_id])):
        try:
            rc = decode_receipt(r.value or b"")
        except CodecError:
            continue
        if rc.head_id == head_id and rc.subject_id == subject_id:
            rep.receipts.append({"event_id": rc.event_id, "status": rc.status, "sample_ids": list(rc.sample_ids),
                                 "head_version": rc.head_version, "reason": rc.reason, "ts": rc.ts,
                                 "retained_hash": rc.retained_hash})


def _scan_deltas(settings: Settings, rep: ErasureReport, timeout: float) -> tuple[list[str], set[tuple[str, str]]]:
    """The subject's samples (into ``rep.samples``, with the key ids that seal them) from the
    head's deltas: (plaintext rows found, (sample, key id) of every sealed row)."""
    head_id, subject_id = rep.head_id, rep.subject_id
    # the subject's rows in deltas: sample ids and key ids are in clear
    plain: list[str] = []
    sealed_refs: set[tuple[str, str]] = set()
    for r in _read(settings, settings.topic("deltas"), timeout, keys_in([head_id])):
        try:
            d = decode_delta(r.value or b"")
        except CodecError:
            continue
        for e in d.entries:
            for i, subj in enumerate(e.subject_ids):
                if subj != subject_id:
                    continue
                sample = e.sample_ids[i]
                rep.samples.setdefault(sample, [])
                if isinstance(e, SealedRowsEntry):
                    sealed_refs.add((sample, e.key_ids[i]))
                    if e.key_ids[i] not in rep.samples[sample]:
                        rep.samples[sample].append(e.key_ids[i])
                elif isinstance(e, RowsEntry):
                    plain.append(f"plaintext row of {sample!r} at {r.partition}/{r.offset}")
    return plain, sealed_refs


def _check_keys(settings: Settings, rep: ErasureReport, plain: list[str], sealed_refs: set[tuple[str, str]],
                timeout: float) -> set[str]:
    """The key stores' checks (subject-keys, transit-private) and the deltas' (every sealed row
    under a destroyed key); the transit key ids still stored."""
    head_id = rep.head_id
    # key family: a superseded generation still holds every key it ever got (tombstones do not
    # erase a log): it must be gone. Only each partition's newest generation is read (reading one
    # about to be deleted crashes librdkafka: runtime.topic_reader.source_partitions).
    fam = keys_family(settings.topic_prefix)
    topics = _all_topics(settings)
    held: list[str] = []
    live_kids: set[str] = set()
    transit_kids: set[str] = set()  # transit keys still stored: their sealed inputs still open
    newest: dict[int, int] = {}
    for topic, (h, s, kid) in _newest_records(settings, fam, topics, newest, timeout):
        if h == head_id and s in rep.samples:
            live_kids.add(kid)
            held.append(f"key {kid} of sample {s!r} in {topic}")
    # older generations may hold keys destroyed since: they must be deleted (within the grace)
    grace = ErasureSettings.of(settings).keys_retire_seconds + 10.0
    held += [f"superseded generation {t} not yet deleted (it may hold keys)"
             for t in superseded_left(settings, fam, newest, grace)]
    rep.checks.append(StoreCheck("subject-keys", not held, "no generation holds a key of the subject's samples"
                                 if not held else f"{len(held)} key records still stored", held))
    tfam, tnewest = transit_private_family(settings.topic_prefix), dict[int, int]()
    transit_kids |= {ref[2] for _, ref in _newest_records(settings, tfam, topics, tnewest, timeout)}
    old_transit = [f"superseded generation {t} not yet deleted (it may hold a destroyed transit key)"
                   for t in superseded_left(settings, tfam, tnewest, grace)]
    rep.checks.append(StoreCheck("transit-private", not old_transit, "no superseded generation left"
                                 if not old_transit else f"{len(old_transit)} superseded generations", old_transit))
    undestroyed = [f"row of {s!r} sealed under key {k} which still exists" for s, k in sorted(sealed_refs)
                   if k in live_kids]
    rep.checks.append(StoreCheck("deltas", not plain and not undestroyed,
                                 f"{len(sealed_refs)} sealed rows, all under destroyed keys" if not plain
                                 and not undestroyed else "readable rows remain", plain + undestroyed))
    return transit_kids


def _check_inputs(settings: Settings, rep: ErasureReport, transit_kids: set[str], timeout: float) -> None:
    """The checks of the stores of raw inputs: featurizer-cache changelog, dead letters, requests."""
    head_id, subject_id = rep.head_id, rep.subject_id
    # featurizer-cache changelog: plaintext records carry the subject in their JSON header
    needle = b'"subject":' + orjson.dumps(subject_id)
    cl = [f"plaintext record {(r.key or b'').decode(errors='replace')[:80]} at {r.partition}/{r.offset}"
          for r in _read(settings, settings.topic("featurizer-cache"), timeout) if r.value and needle in r.value]
    rep.checks.append(StoreCheck("featurizer-cache", not cl, "no plaintext record of the subject" if not cl
                                 else f"{len(cl)} plaintext records of the subject", cl))
    # deadletter originals: readable unless sealed (under a sample key, or for transit under a destroyed key)
    dls = []
    for r in _read(settings, settings.topic("deadletter"), timeout):
        try:
            dl = decode_deadletter(r.value or b"")
        except (CodecError, ValueError):
            continue
        why = (_readable(dl.original, head_id, subject_id, transit_kids, any_op=True)
               or readable_delta(dl.original, head_id, subject_id))
        if why:
            dls.append(f"dead letter {dl.reason} at {r.partition}/{r.offset}: {why}")
    rep.checks.append(StoreCheck("deadletter", not dls, "no readable original request of the subject" if not dls
                                 else f"{len(dls)} refused messages of the subject keep readable bytes", dls))
    raw_topics = (settings.topic("requests"), settings.topic("requests.by-head"))
    raw = [f"{t} {r.partition}/{r.offset}: {why}" for t in raw_topics for r in _read(settings, t, timeout)
           if (why := _readable(r.value, head_id, subject_id, transit_kids))]
    rep.checks.append(StoreCheck("requests", not raw, "no readable raw input of the subject" if not raw
                                 else f"{len(raw)} raw inputs of the subject can still be read", raw))


def _newest_records(settings: Settings, fam: TopicFamily, topics: list[str], newest: dict[int, int],
                    timeout: float) -> list[tuple[str, tuple[str, str, str]]]:
    """(topic, key reference) of every live key record in each partition's newest
    generation of ``fam`` (recorded in ``newest``). Superseded generations are never read: reading
    one about to be deleted crashes librdkafka (runtime.topic_reader.source_partitions)."""
    out = []
    for p in sorted({pg[0] for t in topics if (pg := fam.parse(t)) is not None}):
        newest[p] = fam.generations(topics, p)[-1]
        topic = fam.topic(p, newest[p])
        for r in _read(settings, topic, timeout):
            if r.key is None or r.key == COMPLETE_KEY or r.value is None:
                continue
            try:
                out.append((topic, parse_key_record_key(r.key)))
            except (ValueError, UnicodeDecodeError):
                continue
    return out


def _readable(value: bytes | None, head_id: str, subject_id: str, transit_kids: set[str],
               any_op: bool = False) -> str | None:
    """Why a request of the subject (in this head) can still be read, or None: an add whose
    input is plaintext or sealed under a transit key that still exists (``any_op``: any request of
    the subject that is not sealed, as dead letters were judged before transit sealing)."""
    if not value or b'"' + subject_id.encode() + b'"' not in value or is_redacted(value):
        return None  # (a redacted dead letter keeps the envelope, not the input)
    try:
        req = parse_request(value)
    except InvalidRequest:  # unparsable, but it names the subject: its bytes are plain
        compact = value.replace(b": ", b":")
        return "unparsable plaintext request" if b'"subject_id":' + orjson.dumps(subject_id) in compact else None
    if req.subject_id != subject_id or req.head_id != head_id or (req.op != "add" and not any_op):
        return None
    if isinstance(req.input, SealedInput):
        return f"sealed under transit key {req.input.key_id}, which still exists" \
            if req.input.key_id in transit_kids else None
    return f"plaintext {req.op} {req.event_id!r}"


def _check_caches(settings: Settings, head_id: str, subject_id: str) -> StoreCheck:
    files = sorted(Path(settings.data_dir).glob("featurizer/*/p*.sqlite"))
    if not files:
        return StoreCheck("sqlite cache", True, f"no feature cache under {settings.data_dir} on this host")
    rows = []
    for f in files:
        db = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        try:
            n = db.execute("SELECT COUNT(*) FROM samples WHERE head_id = ? AND subject_id = ?",
                           (head_id, subject_id)).fetchone()[0]
        finally:
            db.close()
        if n:
            rows.append(f"{n} rows in {f}")
    return StoreCheck("sqlite cache", not rows, f"{len(files)} cache files, no row of the subject" if not rows
                      else "rows remain", rows)


def erasure_report_main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="unlearn erasure-report", description=(
        "Check that none of a subject's data can still be read (docs/erasure.md). Exit 0 only if all clear."))
    add_broker_args(ap)
    settings_help(ap, ErasureSettings)
    ap.add_argument("--head", required=True, help="head id")
    ap.add_argument("--subject", required=True, help="subject id")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to read each topic to its end")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--data-dir", help="the featurizer's data dir to check on this host (default: UNLEARN_DATA_DIR)")
    try:
        args = ap.parse_args(argv)
        settings = settings_from_args(args, require_broker=False)
        if args.data_dir:
            settings = settings.with_(data_dir=args.data_dir)
    except (SystemExit, ValueError) as exc:
        return cli_exit_code(exc)
    if not settings.bootstrap:
        print(f"error: {NO_BROKER}", file=sys.stderr)
        return 2
    try:
        rep = erasure_report(settings, args.head, args.subject, args.timeout)
    except TopicReadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(orjson.dumps(rep.to_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        print(rep.summary())
    return 0 if rep.clear else 1
