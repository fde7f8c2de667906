"""What a bench.chaos run must end with, and the judgement: the workload of random adds and deletes
remembers what each head must retain (its from-scratch digest and retained-rows hash), the audit
replays the topics with the ledger's own admission rules against it, and the report says how far
from exact the run was. Apart from the pipeline and its faults: the verdict must not depend on them."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from bench.chaos_pipeline import Config, Pipeline
from bench.publish_clock import distribution
from unlearn.common.families import heads_family
from unlearn.features.contract import quantize_feature_row
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.ledger import ExactLedger, MultisetHash
from unlearn.runtime.topic_reader import read_topic
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.delta_codec import decode_delta
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.head import HeadUpdate, decode_head
from unlearn.schemas.receipts import decode_receipt
from unlearn.schemas.request_inputs import FeaturesInput
from unlearn.schemas.sealed import SealError
from unlearn.streams.ledger.delta_rules import admit, apply_entries, creates_head, record_applied
from unlearn.streams.ledger.row_opener import RowOpener


@dataclass
class Report:
    """What a run ends with: the --json file's fields; exact iff every correctness count is 0."""

    config: dict[str, Any]
    machine: str
    events_produced: int = 0
    adds: int = 0
    deletes: int = 0
    lost_events: int = 0
    doubled_events: int = 0
    digest_mismatched_heads: int = 0
    retained_hash_mismatched_heads: int = 0
    versions_with_two_digests: int = 0
    versions_with_two_retained_hashes: int = 0
    head_updates_seen: int = 0  # by a follower of the heads family during the whole run
    heads_generations: int = 0  # the most heads generations seen in use, over all partitions
    receipts_missing: int = 0
    receipts_duplicated: int = 0
    receipts_conflicting: int = 0
    kills: list[str] = field(default_factory=list)
    broker_restarts: int = 0
    node_kills: list[int] = field(default_factory=list)  # Kafka node ids, in order
    cluster_restarts: int = 0
    unplanned_worker_restarts: int = 0  # workers found dead that no kill of ours explains
    node_outage_s: list[float] = field(default_factory=list)  # kill -9 -> restarted node answers
    produce_errors: int = 0  # the benchmark's own produce calls that failed, even when sent again
    produce_resent: int = 0  # of those, sent again as an at-least-once app does (same event id and content)
    loadavg: list[float] = field(default_factory=list)  # 1-minute load average at the start and the end
    timeline: list[str] = field(default_factory=list)
    recovery_s: dict[str, list[float]] = field(default_factory=dict)
    publish_after_fault_s: dict[str, list[float]] = field(default_factory=dict)  # fault kind -> seconds
    elapsed_s: float = 0.0
    examples: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not (self.lost_events or self.doubled_events or self.digest_mismatched_heads
                    or self.retained_hash_mismatched_heads or self.versions_with_two_digests
                    or self.versions_with_two_retained_hashes or self.receipts_missing or self.receipts_conflicting
                    or self.unplanned_worker_restarts)


class Workload:
    """Random adds and deletes over several heads; remembers what must be retained."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.heads = [f"chaos{i}" for i in range(cfg.heads)]
        self.live: dict[str, dict[str, tuple[np.ndarray, int, str]]] = {h: {} for h in self.heads}
        self.add_events: dict[str, tuple[str, str]] = {}  # event -> (head, sample)
        self.delete_events: dict[str, tuple[str, str, str]] = {}  # event -> (head, subject, sample)
        self.n = 0

    def next(self) -> tuple[str, bytes]:
        self.n += 1
        h = self.heads[int(self.rng.integers(len(self.heads)))]
        live = self.live[h]
        if live and self.rng.random() < self.cfg.delete_fraction:
            sample = sorted(live)[int(self.rng.integers(len(live)))]
            _, _, subject = live.pop(sample)
            ev = f"d{self.n}"
            self.delete_events[ev] = (h, subject, sample)
            return subject, encode_request(Request(ev, "delete", h, "chaos", subject, sample))
        f = self.rng.normal(size=self.cfg.dim)
        label = int(self.rng.integers(4))
        subject = f"u{int(self.rng.integers(200))}"
        sample = f"s{self.n}"
        ev = f"a{self.n}"
        live[sample] = (f, label, subject)
        self.add_events[ev] = (h, sample)
        return subject, encode_request(Request(ev, "add", h, "chaos", subject, sample, label,
                                               FeaturesInput(tuple(float(x) for x in f))))

    def _retained(self, head: str, settings: Settings) -> tuple[np.ndarray, np.ndarray]:
        """The head's retained rows, quantized by the feature contract, and their labels."""
        rows = list(self.live[head].values())
        if not rows:
            return np.zeros((0, self.cfg.dim), np.int64), np.zeros(0, np.int64)
        heads = HeadSettings.of(settings)
        Q = np.stack([quantize_feature_row(f, heads.frac_bits, heads.feature_bound) for f, _, _ in rows])
        return Q, np.array([lab for _, lab, _ in rows], np.int64)

    def reference_digest(self, head: str, n_outputs: int, settings: Settings) -> str:
        Q, y = self._retained(head, settings)
        heads = HeadSettings.of(settings)
        led = ExactLedger(self.cfg.dim, n_outputs, heads.frac_bits, heads.label_frac_bits)
        if len(y):
            led.add(Q, y)
        led.grow_outputs(n_outputs)
        return led.digest()

    def reference_retained_hash(self, head: str, settings: Settings) -> str:
        Q, y = self._retained(head, settings)
        heads = HeadSettings.of(settings)
        return MultisetHash.of_rows(Q, y, heads.frac_bits, heads.label_frac_bits).fingerprint()


def _latest_heads(records: list[Any]) -> tuple[dict[str, HeadUpdate], dict[tuple[str, int], set[str]],
                                               dict[tuple[str, int], set[str | None]]]:
    """(latest exact update per head, digests (of the updates that carry one) and retained-rows
    hashes per (head, version))."""
    latest: dict[str, HeadUpdate] = {}
    digests: dict[tuple[str, int], set[str]] = {}
    retained: dict[tuple[str, int], set[str | None]] = {}
    for r in records:
        try:
            u = decode_head(r.value or b"")
        except CodecError:
            continue
        if u.digest is not None:
            digests.setdefault((u.head_id, u.version), set()).add(u.digest)
        retained.setdefault((u.head_id, u.version), set()).add(u.retained_hash)
        if u.mode == "exact" and u.supersedes(latest.get(u.head_id)):
            latest[u.head_id] = u
    return latest, digests, retained


def _applied_events(records: list[Any], dim: int, opener: RowOpener | None = None) -> Counter[tuple[str, str]]:
    """(event id, sample id) -> times applied, replaying deltas with the ledger's admission rules.
    Sealed rows are opened with ``opener`` (docs/erasure.md); a row whose key is destroyed since
    (an erased add or delete: the pairs cancel) counts as applied when its message is admitted."""
    applied: Counter[tuple[str, str]] = Counter()
    positions: dict[str, Any] = {}
    ledgers: dict[str, ExactLedger] = {}

    class Pos:
        def __init__(self) -> None:
            self.applied_offset = -1
            self.source_offsets: dict[str, int] = {}

    for r in records:  # one partition after another, each in offset order: per head, log order
        try:
            delta = decode_delta(r.value or b"")
            opened = opener.open(delta) if opener is not None else None
        except (CodecError, SealError):
            continue
        erased = opened.erased if opened is not None else []
        creates = creates_head(delta)  # as sealed: a first message whose rows are all erased still made the head
        if opened is not None:
            delta = opened.delta
        if delta.head_id not in ledgers:
            if not creates:
                continue
            ledgers[delta.head_id] = ExactLedger(delta.d, 0, delta.frac_bits, delta.label_frac_bits)
            positions[delta.head_id] = Pos()
        pos, led = positions[delta.head_id], ledgers[delta.head_id]
        if admit(pos, delta, r.offset):
            continue
        for e in erased:
            applied[(e.event_id, e.sample_id)] += 1

        def apply(entry: Any, led: ExactLedger = led) -> bool:
            (led.add if entry.sign > 0 else led.delete)(entry.q, entry.labels)
            return True

        for _, entry, result in apply_entries(delta.head_id, delta, led, apply):
            if result is True:
                for ev, sample in zip(entry.event_ids, entry.sample_ids, strict=True):
                    applied[(ev, sample)] += 1
        record_applied(pos, delta, r.offset)
    return applied


def audit(pipe: Pipeline, work: Workload, report: Report) -> None:
    """Wait for the heads to settle, then count into ``report`` every way the run could be inexact:
    against the workload's from-scratch reference, and by replaying the topics with the ledger's own
    rules (an audit judged by the code that decided, not by a copy of it)."""
    s = pipe.settings
    deadline = time.monotonic() + pipe.cfg.settle_timeout
    latest: dict[str, HeadUpdate] = {}
    while True:  # settle: every head's latest exact update equals its reference
        latest, digests, retained = _latest_heads(read_topic(s, heads_family(s.topic_prefix)))
        pending = [h for h in work.heads
                   if h not in latest or latest[h].digest != work.reference_digest(h, latest[h].c, s)]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    report.digest_mismatched_heads = len(pending)
    report.examples += [f"head {h}: final digest differs from a from-scratch ledger" for h in pending[:3]]
    off = [h for h in work.heads if h in latest and latest[h].retained_hash != work.reference_retained_hash(h, s)]
    report.retained_hash_mismatched_heads = len(off)
    report.examples += [f"head {h}: final retained-rows hash differs from a from-scratch one" for h in off[:3]]
    for key, seen in pipe.digests.items():
        digests.setdefault(key, set()).update(seen)
    for key, hashes in pipe.retained_hashes.items():
        retained.setdefault(key, set()).update(hashes)
    report.versions_with_two_digests = sum(1 for d in digests.values() if len(d) > 1)
    report.head_updates_seen = pipe.head_updates
    report.heads_generations = len(pipe.heads_topics)

    applied = _applied_events(read_topic(s, s.topic("deltas")), pipe.cfg.dim, RowOpener(s, batch=True))
    expected = {(ev, sample) for ev, (_, sample) in work.add_events.items()}
    expected |= {(ev, sample) for ev, (_, _, sample) in work.delete_events.items()}
    lost = [k for k in expected if applied.get(k, 0) == 0]
    doubled = [k for k, n in applied.items() if n > 1]
    report.lost_events, report.doubled_events = len(lost), len(doubled)
    report.examples += [f"lost {k}" for k in lost[:3]] + [f"doubled {k}" for k in doubled[:3]]

    receipts: dict[str, list[bytes]] = {}
    for r in read_topic(s, s.topic("receipts")):
        try:
            rec = decode_receipt(r.value or b"")
        except Exception:  # undecodable receipts are not ours to count
            continue
        if rec.status == "applied":
            content = orjson.dumps([rec.head_id, rec.head_version, rec.digest, rec.retained_hash,
                                    sorted(rec.sample_ids)])
            receipts.setdefault(rec.event_id, []).append(content)
            retained.setdefault((rec.head_id, int(rec.head_version or 0)), set()).add(rec.retained_hash)
    report.versions_with_two_retained_hashes = sum(1 for h in retained.values() if len(h) > 1)
    report.receipts_missing = sum(1 for ev in work.delete_events if ev not in receipts)
    report.receipts_duplicated = sum(1 for ev in work.delete_events if len(receipts.get(ev, [])) > 1)
    report.receipts_conflicting = sum(1 for ev in work.delete_events if len(set(receipts.get(ev, []))) > 1)


def render(r: Report) -> str:
    """The report as the table a run prints (bench/results/chaos*.md quote it)."""
    def stats(xs: list[float]) -> str:
        return f"p50 {statistics.median(xs):.2f} s, max {max(xs):.2f} s (n={len(xs)})" if xs else "-"

    lines = [
        f"chaos benchmark on {r.machine}",
        f"config: {r.config}",
        f"events produced {r.events_produced} (adds {r.adds}, deletes {r.deletes}); kills {len(r.kills)} "
        f"({dict(Counter(r.kills))}); broker restarts {r.broker_restarts}; elapsed {r.elapsed_s} s"
        + (f"; load average {r.loadavg[0]} -> {r.loadavg[-1]}" if r.loadavg else ""),
        "",
        "| check | count |",
        "|---|---|",
        f"| lost events | {r.lost_events} |",
        f"| doubled events | {r.doubled_events} |",
        f"| heads whose final digest differs from a from-scratch ledger | {r.digest_mismatched_heads} |",
        f"| heads whose final retained-rows hash differs from a from-scratch one | "
        f"{r.retained_hash_mismatched_heads} |",
        f"| (head, version) pairs with two digests (over {r.head_updates_seen} updates followed live, "
        f"{r.heads_generations} heads topics) | {r.versions_with_two_digests} |",
        f"| (head, version) pairs with two retained-rows hashes (head updates and receipts) | "
        f"{r.versions_with_two_retained_hashes} |",
        f"| deletes without an applied receipt | {r.receipts_missing} |",
        f"| deletes with conflicting receipts | {r.receipts_conflicting} |",
        f"| deletes with identical duplicate receipts (allowed: at-least-once) | {r.receipts_duplicated} |",
        f"| worker restarts no kill caused (a worker that did not ride through a broker fault) | "
        f"{r.unplanned_worker_restarts} |",
        f"| the benchmark's own produce calls that failed (sent again: {r.produce_resent}) | {r.produce_errors} |",
        "",
        f"recovery to readiness: ledger {stats(r.recovery_s.get('ledger', []))}; "
        f"featurizer {stats(r.recovery_s.get('featurizer', []))}; broker {stats(r.recovery_s.get('broker', []))}",
        "fault -> first new head version published (s): " + "; ".join(
            f"{kind} {distribution(xs)}" for kind, xs in sorted(r.publish_after_fault_s.items())),
        f"verdict: {'EXACT' if r.exact else 'NOT EXACT'}",
    ]
    if r.node_kills or r.cluster_restarts:
        lines[3:3] = [f"Kafka node kills {len(r.node_kills)} (nodes {r.node_kills}); cluster restarts "
                      f"{r.cluster_restarts}"]
        lines[-1:-1] = [
            f"Kafka node kill -9 -> restarted node answering: {stats(r.node_outage_s)}; then every partition "
            f"back in full ISR: {stats(r.recovery_s.get('node_isr', []))}",
            f"whole cluster stop -> every node answering: {stats(r.recovery_s.get('broker', []))}; then full ISR: "
            f"{stats(r.recovery_s.get('cluster_isr', []))}"]
    if r.timeline:
        lines += ["", "timeline (s from the start):"] + [f"  {t}" for t in r.timeline]
    lines += [f"  e.g. {e}" for e in r.examples]
    return "\n".join(lines)
