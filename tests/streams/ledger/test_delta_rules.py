"""The rules deltas apply by (streams/ledger/delta_rules.py), ``declare_outputs``: a head's label
columns are its contract's class count, named by its deltas (docs/registry.md,
docs/formats.md): never the largest label seen plus one, so a head's shape reveals no label and
its digest equals a from-scratch build given the contract; ``extend`` grows them; the verifier
replays the same. Old-format deltas (no contract) keep the old rule."""

from __future__ import annotations

import numpy as np

from tests.services.verifier.support import CFG, records_of, simulate, status
from unlearn.ledger import ExactLedger, Quantizer, l2_normalize, solve_head
from unlearn.schemas.delta_codec import Delta, RowsEntry, encode_delta
from unlearn.services.verifier import verify
from unlearn.services.verifier.replay import replay_log
from unlearn.streams.ledger.head_runtime import HeadRuntime

D = 6


def rows(tag: str, labels: list[int], seed: int, sign: int = 1) -> RowsEntry:
    Q = Quantizer().quantize(l2_normalize(np.random.default_rng(seed).normal(size=(len(labels), D))))
    ids = [f"{tag}{i}" for i in range(len(labels))]
    # a delete is an event of its own: its id never reuses its add's (docs/featurizer.md, "Event ids")
    events = [f"ev-{'del-' if sign < 0 else ''}{i}" for i in ids]
    return RowsEntry(sign, events, ids, ["u"] * len(labels), np.array(labels, np.int64), Q)


def delta(src: int, entries: list[RowsEntry], contract: tuple[int, int] | None) -> Delta:
    return Delta("h", f"requests/0@{src}", D, 30, 0, tuple(entries), *(contract or (None, None)))


def scratch(c: int, *entries: RowsEntry) -> ExactLedger:
    """An independent from-scratch ledger with ``c`` columns from the start."""
    led = ExactLedger(D, c, 30, 0)
    for e in entries:
        (led.add if e.sign > 0 else led.delete)(e.q, e.labels)
    return led


def test_declared_class_count_sizes_the_head_not_the_labels_seen() -> None:
    e = rows("a", [3, 3, 3], seed=1)
    rt = HeadRuntime.new("h", delta(1, [e], (10, 1)), CFG)
    rt.apply(delta(1, [e], (10, 1)), 0, 0)
    rt.sync()
    assert rt.ledger.n_outputs == 10 and rt.weights.shape == (D, 10) and rt.contract_version == 1
    ref = scratch(10, e)
    assert rt.digest() == ref.digest()
    rt.reset("check")
    assert np.array_equal(rt.weights, solve_head(ref, CFG.gamma))
    assert not rt.weights[:, [0, 1, 2, 4, 5, 6, 7, 8, 9]].any()  # unseen classes: zero columns


def test_extend_grows_the_columns_and_a_lagging_delta_never_shrinks_them() -> None:
    a, b, c = rows("a", [3], seed=1), rows("b", [11, 0], seed=2), rows("c", [1], seed=3)
    rt = HeadRuntime.new("h", delta(1, [a], (10, 1)), CFG)
    rt.apply(delta(1, [a], (10, 1)), 0, 0)
    rt.apply(delta(2, [b], (12, 2)), 1, 0)  # after `unlearn heads extend --classes 12`
    rt.sync()
    assert rt.ledger.n_outputs == 12 and rt.weights.shape == (D, 12) and rt.contract_version == 2
    assert rt.digest() == scratch(12, a, b).digest()
    rt.apply(delta(3, [c], (10, 1)), 2, 0)  # judged by a featurizer whose registry view lagged
    rt.sync()
    assert rt.ledger.n_outputs == 12 and rt.contract_version == 2
    assert rt.digest() == scratch(12, a, b, c).digest()
    # and it survives a snapshot round trip
    again = HeadRuntime.from_snapshot(rt.state(), CFG)
    assert again.contract_version == 2 and again.meta() == rt.meta()


def test_old_format_deltas_keep_the_largest_label_rule() -> None:
    e = rows("a", [3], seed=1)
    rt = HeadRuntime.new("h", delta(1, [e], None), CFG)
    rt.apply(delta(1, [e], None), 0, 0)
    rt.sync()
    assert rt.ledger.n_outputs == 4 and rt.contract_version is None
    assert rt.digest() == scratch(0, e).digest()
    rt.apply(delta(2, [rows("b", [1], seed=2)], (10, 1)), 1, 0)  # a featurizer upgraded mid-stream
    assert rt.ledger.n_outputs == 10 and rt.contract_version == 1


def test_the_verifier_replays_the_declared_columns_and_checks_the_contract_version() -> None:
    a, b, c = rows("a", [3, 3], seed=1), rows("b", [11], seed=2), rows("c", [3], seed=3)
    msgs = [(b"h", encode_delta(delta(1, [a], (10, 1)))), (b"h", encode_delta(delta(2, [c], (10, 1)))),
            (b"h", encode_delta(delta(3, [b], (12, 2)))),
            (b"h", encode_delta(delta(4, [rows("a", [3, 3], seed=1, sign=-1)], (12, 2))))]
    recs = records_of(msgs)
    rep = replay_log(recs, "h")
    assert rep.ledger is not None and rep.ledger.n_outputs == 12
    assert rep.contract_version_at == {1: 1, 2: 1, 3: 2, 4: 2}
    assert rep.ledger.digest() == scratch(12, c, b).digest()
    ups, _rt, reasons = simulate(recs, "h", final_reset=True)
    assert reasons == [] and ups[-1].contract_version == 2 and ups[-1].weights.shape == (D, 12)
    cert = verify(recs, ups, "h", orders=3, partitionings=3, seed=1)
    assert cert.ok, [(c.name, c.status, c.detail) for c in cert.checks]
    assert status(cert, "live_digest") == "pass" and status(cert, "shuffled_orders") == "pass"
    forged = [*ups[:-1], type(ups[-1])(**{**{f: getattr(ups[-1], f) for f in type(ups[-1]).__slots__},
                                         "contract_version": 1})]
    bad = verify(recs, forged, "h", orders=1, partitionings=1, seed=1)
    assert status(bad, "live_digest") == "fail"
