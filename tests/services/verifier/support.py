"""Helpers shared by the verifier tests: a random stream of deltas with the anomalies the live
ledger skips, and the live ledger's own decisions on it (``HeadRuntime``) as the reference."""

from __future__ import annotations

import time

import numpy as np

from unlearn.ledger import ExactLedger, Quantizer, l2_normalize
from unlearn.runtime.topic_reader import LogRecord
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.delta_codec import Delta, RowsEntry, decode_delta, encode_delta
from unlearn.schemas.head import HeadUpdate
from unlearn.schemas.receipts import Receipt
from unlearn.services.verifier import Certificate
from unlearn.streams.ledger.head_runtime import HeadConfig, HeadRuntime

CFG = HeadConfig(gamma=0.5, reset_every=7, drift_threshold=1e-9)


class StreamBuilder:
    """Random adds/deletes/delete_subjects for one head, plus the anomalies the live ledger skips."""

    def __init__(self, head: str = "h", d: int = 8, seed: int = 0, label_frac_bits: int = 0,
                 vector_width: int = 0) -> None:
        self.head, self.d, self.k_y, self.vw = head, d, label_frac_bits, vector_width
        self.rng = np.random.default_rng(seed)
        self.members: dict[str, tuple[np.ndarray, object, str]] = {}
        self.msgs: list[tuple[bytes | None, bytes]] = []
        self.n = 0
        self.src = 0

    def _labels(self, n: int) -> np.ndarray:
        if self.vw:
            y = self.rng.uniform(-1, 1, size=(n, self.vw))
            return np.rint(y * 2**self.k_y).astype(np.int64)
        return self.rng.integers(0, 4, n)

    def _source(self) -> str:
        self.src += 1
        return f"requests/0@{self.src}"

    def emit(self, entries: list, key: str | None = None, source: str | None = None) -> bytes:
        raw = encode_delta(Delta(self.head, source or self._source(), self.d, 30, self.k_y, tuple(entries)))
        self.msgs.append(((key or self.head).encode(), raw))
        return raw

    def add(self, n: int | None = None, subject: str | None = None) -> RowsEntry:
        n = n or int(self.rng.integers(1, 6))
        Q = Quantizer().quantize(l2_normalize(self.rng.normal(size=(n, self.d))))
        y = self._labels(n)
        ids = [f"s{self.n + i}" for i in range(n)]
        subj = [subject or f"u{int(self.rng.integers(0, 6))}" for _ in range(n)]
        self.n += n
        for i, q, lab, s in zip(ids, Q, y, subj, strict=True):
            self.members[i] = (q, lab, s)
        return RowsEntry(+1, [f"add-{i}" for i in ids], ids, subj, y, Q)

    def delete(self, k: int | None = None) -> RowsEntry | None:
        if not self.members:
            return None
        k = min(len(self.members), k or int(self.rng.integers(1, 4)))
        ids = list(self.rng.choice(sorted(self.members), size=k, replace=False))
        return self._del(ids, [f"del-{i}" for i in ids])

    def delete_subject(self) -> RowsEntry | None:
        subjects = sorted({s for _, _, s in self.members.values()})
        if not subjects:
            return None
        subj = subjects[int(self.rng.integers(len(subjects)))]
        ids = sorted(i for i, (_, _, s) in self.members.items() if s == subj)
        return self._del(ids, [f"ds-{subj}-{self.src}"] * len(ids))

    def _del(self, ids: list[str], events: list[str]) -> RowsEntry:
        Q = np.stack([self.members[i][0] for i in ids])
        y = np.stack([np.asarray(self.members[i][1]) for i in ids])
        subj = [self.members[i][2] for i in ids]
        for i in ids:
            del self.members[i]
        return RowsEntry(-1, events, ids, subj, y, Q)

    def random_message(self) -> bytes:
        entries = [self.add()]
        r = self.rng.random()
        if r < 0.35:
            e = self.delete()
        elif r < 0.5:
            e = self.delete_subject()
        else:
            e = None
        if e is not None:
            entries.append(e)
        return self.emit(entries)

    def non_member(self, cls: int = 9) -> RowsEntry:
        """A delete of a row never added, with a class the head never saw: the ledger refuses it."""
        Q = Quantizer().quantize(l2_normalize(self.rng.normal(size=(1, self.d))))
        return RowsEntry(-1, ["ghost-ev"], ["ghost"], ["nobody"], np.array([cls]), Q)

    def reference(self) -> ExactLedger:
        led = ExactLedger(self.d, 0, 30, self.k_y)
        if self.members:
            led.add(np.stack([q for q, _, _ in self.members.values()]),
                    np.stack([np.asarray(lab) for _, lab, _ in self.members.values()]))
        return led


def anomalous_stream(seed: int = 0, n_msgs: int = 30, **kw: object) -> StreamBuilder:
    b = StreamBuilder(seed=seed, **kw)  # type: ignore[arg-type]
    # a delete before the head exists: rejected (unknown_head), no version
    b.emit([b.non_member()])
    for i in range(n_msgs):
        raw = b.random_message()
        if i == 5:  # the featurizer re-produced a batch after a crash: same source id
            b.msgs.append((b.head.encode(), raw))
        if i == 9:  # corrupt bytes keyed to the head: dead-lettered
            b.msgs.append((b.head.encode(), raw[:-3] + b"xyz"))
        if i == 12:  # another head's traffic on the same topic
            other = StreamBuilder(head="other", d=5, seed=99)
            b.msgs.append((b"other", encode_delta(Delta("other", "requests/1@1", 5, 30, 0, (other.add(),)))))
        if i == 15:  # a non-member delete next to a good add: entry rejected, the add applies
            b.emit([b.add(), b.non_member()])
    return b


def records_of(msgs: list[tuple[bytes | None, bytes]]) -> list[LogRecord]:
    return [LogRecord(0, off, 1_000 + off, key, raw) for off, (key, raw) in enumerate(msgs)]


def head_update(rt: HeadRuntime, mode: str | None = None) -> HeadUpdate:
    """What LedgerWorker.head_update publishes (the digest on exact updates only)."""
    mode = mode or rt.mode
    return HeadUpdate(rt.head_id, rt.version, mode, rt.digest() if mode == "exact" else None, rt.ledger.count,
                      rt.events_covered, ((rt.input_partition, rt.applied_offset),),
                      0.0 if mode == "exact" else rt.fast_drift, rt.config.gamma, time.time(), rt.weights.copy(),
                      rt.posterior.copy() if mode == "exact" else None, rt.retained_hash(),
                      rt.contract_version, rt.retained_classes())


def simulate(records: list[LogRecord], head_id: str, timer_resets: set[int] = frozenset(),
             final_reset: bool = False, poll: int = 1) -> tuple[list[HeadUpdate], HeadRuntime, list[str]]:
    """The live ledger processor's decisions (HeadRuntime), with a timer reset after the given
    versions (and at the end): the head updates it would publish and the rejection reasons."""
    ups, rt, reasons, _ = simulate_with_receipts(records, head_id, timer_resets, final_reset, poll)
    return ups, rt, reasons


def simulate_with_receipts(records: list[LogRecord], head_id: str, timer_resets: set[int] = frozenset(),
                           final_reset: bool = False, poll: int = 1
                           ) -> tuple[list[HeadUpdate], HeadRuntime, list[str], list[Receipt]]:
    """``simulate``, and the applied receipts the worker would publish (LedgerWorker._publish_poll):
    ``poll`` records per consume call, each poll coalesced into one head update."""
    rt: HeadRuntime | None = None
    ups: list[HeadUpdate] = []
    reasons: list[str] = []
    receipts: list[Receipt] = []
    for start in range(0, len(records), poll):
        outcomes = []
        for r in records[start:start + poll]:
            if r.key and r.key != head_id.encode():
                continue
            try:
                delta = decode_delta(r.value)
            except CodecError:
                continue
            if rt is None:
                if not any(e.sign > 0 for e in delta.entries):
                    reasons += ["unknown_head"] * len(delta.entries)
                    continue
                rt = HeadRuntime.new(head_id, delta, CFG)
            out = rt.apply(delta, r.offset, r.partition)
            if not out.skipped:
                reasons += [x.reason for x in out.rejections]
                outcomes.append(out)
        if rt is None or not outcomes:
            continue
        rt.sync()
        ups.append(head_update(rt))
        receipts += [Receipt.applied(d.event_id, d.subject_id, head_id, d.sample_ids, out.version, None, 1.0,
                                     retained_hash=out.retained_hash) for out in outcomes for d in out.deletes]
        if rt.version in timer_resets and rt.mode == "fast":
            rt.reset("timer")
            ups.append(head_update(rt))
    assert rt is not None
    if final_reset and rt.mode == "fast":
        rt.reset("timer")
        ups.append(head_update(rt))
    return ups, rt, reasons, receipts


def status(cert: Certificate, name: str) -> str:
    return next(c.status for c in cert.checks if c.name == name)
