"""Shuffled orders and partitionings: the add-before-delete DAG, packed entries, vector labels."""

from __future__ import annotations

import numpy as np

from tests.services.verifier.support import StreamBuilder, records_of, simulate, status
from unlearn.ledger import ExactLedger
from unlearn.schemas.delta_codec import PackedEntry
from unlearn.services.verifier import replay_log, verify
from unlearn.services.verifier.orders import components, dependencies, retained_rows, shuffled_digest


def test_packed_entries_and_vector_labels() -> None:
    b = StreamBuilder(seed=4, d=6, label_frac_bits=8, vector_width=3)
    for _ in range(6):
        b.random_message()
    # a packed batch (federated site): statistics only
    extra = b.add(n=5)
    blob = ExactLedger.from_rows(extra.q, extra.labels, frac_bits=30, label_frac_bits=8).to_bytes()
    b.emit([PackedEntry(+1, extra.event_ids, extra.sample_ids, extra.subject_ids, blob)])
    b.emit([b.delete(2)])
    b.emit([b._del([extra.sample_ids[0], extra.sample_ids[1]], ["pk-del", "pk-del"])])  # rows out of the packed add
    recs = records_of(b.msgs)
    ups, _rt, _ = simulate(recs, "h", final_reset=True)
    cert = verify(recs, ups, "h", orders=3, partitionings=2, seed=9)
    assert cert.ok, cert.summary()
    assert cert.replay["digest"] == b.reference().digest()
    assert status(cert, "from_scratch") == "skipped" and status(cert, "retrain_deviation") == "skipped"
    assert status(cert, "shuffled_orders") == "pass" and status(cert, "repartitionings") == "pass"
    # rows only (no packed): vector labels on their own grid, retrain reference agrees
    b2 = StreamBuilder(seed=5, d=6, label_frac_bits=8, vector_width=3)
    for _ in range(10):
        b2.random_message()
    recs2 = records_of(b2.msgs)
    ups2, _, _ = simulate(recs2, "h", final_reset=True)
    cert2 = verify(recs2, ups2, "h", orders=2, partitionings=2, seed=3)
    assert cert2.ok and status(cert2, "retrain_deviation") == "pass", cert2.summary()


def test_deletes_depend_on_their_adds_and_shuffles_respect_it() -> None:
    b = StreamBuilder(seed=21)
    for _ in range(12):
        b.random_message()
    units = replay_log(records_of(b.msgs), "h").units
    deps = dependencies(units)
    assert deps.unmatched == []
    for parent, kids in enumerate(deps.children):
        for kid in kids:
            assert units.sign[parent] > 0 > units.sign[kid] and parent < kid
            assert set(units.samples[kid]) & set(units.samples[parent])
    assert sum(deps.indegree) == sum(len(k) for k in deps.children)
    # every sample's add and delete land in one partition group
    group_of = {u: g for g, comp in enumerate(components(units)) for u in comp}
    for parent, kids in enumerate(deps.children):
        assert all(group_of[k] == group_of[parent] for k in kids)
    retained = retained_rows(units, deps)
    assert retained is not None and len(retained) == len(b.members)
    digests = {shuffled_digest(units, np.random.default_rng(s), deps)[0] for s in range(4)}
    assert digests == {b.reference().digest()}
