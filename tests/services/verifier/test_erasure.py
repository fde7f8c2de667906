"""A head whose first deltas message is fully erased (a lone add, later deleted and its key
destroyed): the replay decides head creation on the message as sent, so its versions and digest
are the live ledger's, which opened the row while it was readable (docs/erasure.md)."""

from __future__ import annotations

from dataclasses import replace

from tests.services.verifier.support import StreamBuilder, records_of, simulate
from unlearn.infra.settings import Settings
from unlearn.schemas.delta_codec import decode_delta, encode_delta
from unlearn.schemas.sealed import SampleKey, new_key, seal_delta
from unlearn.services.verifier import replay_log, verify
from unlearn.services.verifier.erasure import open_records, unreproducible_versions
from unlearn.streams.ledger.delta_rules import creates_head
from unlearn.streams.ledger.row_opener import RowOpener


class _Ring(RowOpener):
    """The key family after the shred: every key but the destroyed ones."""

    def __init__(self, keys: dict[tuple[str, str, str], SampleKey], destroyed: set[str]) -> None:
        super().__init__(Settings(), batch=True)
        self.keys = {ref: k for ref, k in keys.items() if ref[1] not in destroyed}

    def lookup(self, head_id: str, sample_id: str, key_id: str) -> SampleKey | None:
        return self.keys.get((head_id, sample_id, key_id))


def test_a_fully_erased_first_message_still_creates_the_head() -> None:
    b = StreamBuilder(seed=3)
    b.emit([b.add(n=1)])  # the head's first message: a lone add of s0
    for _ in range(3):
        b.emit([b.add(n=3)])
    b.emit([b._del(["s0"], ["del-s0"])])
    b.emit([b.add(n=2)])
    plain = records_of(b.msgs)
    ups, live, _ = simulate(plain, "h", final_reset=True)  # the live ledger opened every row

    keys: dict[tuple[str, str, str], SampleKey] = {}
    by_sample: dict[str, SampleKey] = {}

    def key_for(head: str, sample: str) -> SampleKey:
        k = by_sample.setdefault(sample, new_key())
        keys[(head, sample, k.key_id)] = k
        return k

    sealed = [replace(r, value=encode_delta(seal_delta(decode_delta(r.value or b""), key_for))) for r in plain]
    opened, ev = open_records(sealed, "h", _Ring(keys, destroyed={"s0"}))
    assert len(ev.pairs) == 1 and not ev.unpaired
    first = decode_delta(opened[0].value or b"")
    assert not first.entries and not creates_head(first)  # nothing of it opens...
    assert (0, 0) in ev.sealed_adds  # ...but as sent it was an add

    rep = replay_log(opened, "h", created_at=ev.sealed_adds)
    assert rep.version == live.version and rep.offset_of_version[1] == (0, 0)
    assert rep.ledger is not None and rep.ledger.digest() == live.ledger.digest()
    # what a replay deciding creation on the opened rows got: one version short
    assert replay_log(opened, "h").version == live.version - 1

    gone = unreproducible_versions(opened, "h", ev)
    assert gone == {1, 2, 3, 4}  # the states that held s0, from its add to before its delete
    checked = [u for u in ups if u.version not in gone]
    cert = verify(opened, checked, "h", orders=2, partitionings=2, seed=1, created_at=ev.sealed_adds)
    assert cert.ok, cert.summary()
    assert cert.replay["version"] == live.version
    live_check = verify(opened, checked, "h", orders=1, partitionings=1, seed=1)
    assert not live_check.ok  # without it, the versions shift by one
