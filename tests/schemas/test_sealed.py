"""Sealing per-sample rows (schemas/sealed.py): round trips, context
binding, commitments, and the sealed deltas entry."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.schemas.delta_codec import (
    CodecError,
    Delta,
    PackedEntry,
    RowsEntry,
    SealedRowsEntry,
    decode_delta,
    encode_delta,
)
from unlearn.schemas.sealed import (
    PURPOSE_CHANGELOG,
    PURPOSE_ROW,
    SampleKey,
    SealError,
    commitment,
    decode_key_record,
    encode_key_record,
    new_key,
    open_delta,
    row_bytes,
    seal,
    seal_delta,
    unseal,
)

ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)


@settings(max_examples=50, deadline=None)
@given(pt=st.binary(max_size=300), head=ids, sample=ids, other=ids)
def test_seal_round_trip_and_binding(pt: bytes, head: str, sample: str, other: str) -> None:
    k = new_key()
    ct = seal(k, PURPOSE_ROW, head, sample, pt)
    assert unseal(k, PURPOSE_ROW, head, sample, ct) == pt
    assert seal(k, PURPOSE_ROW, head, sample, pt) != ct  # fresh nonce
    if other != sample:
        with pytest.raises(SealError):
            unseal(k, PURPOSE_ROW, head, other, ct)  # moved to another sample
    with pytest.raises(SealError):
        unseal(k, PURPOSE_CHANGELOG, head, sample, ct)  # another purpose
    with pytest.raises(SealError):
        unseal(new_key(), PURPOSE_ROW, head, sample, ct)  # another key
    with pytest.raises(SealError):
        unseal(SampleKey(new_key().key_id, k.key), PURPOSE_ROW, head, sample, ct)  # another key id
    flipped = bytearray(ct)
    flipped[-1] ^= 1
    with pytest.raises(SealError):
        unseal(k, PURPOSE_ROW, head, sample, bytes(flipped))
    assert len(pt) < 16 or pt not in ct


@settings(max_examples=50, deadline=None)
@given(q=st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=8), label=st.integers(0, 1000))
def test_commitment_binds_row_and_key(q: list[int], label: int) -> None:
    k = new_key()
    row = row_bytes(np.array(q), label)
    c = commitment(k, "h", "s", row)
    assert c == commitment(k, "h", "s", row) and len(c) == 32
    assert c != commitment(new_key(), "h", "s", row)
    assert c != commitment(k, "h", "s", row_bytes(np.array(q), label + 1))
    assert c != commitment(k, "h", "t", row)


def test_key_record_round_trip_and_repr() -> None:
    k = new_key()
    assert decode_key_record(encode_key_record(k)) == k
    assert k.key.hex() not in repr(k)
    with pytest.raises(SealError):
        decode_key_record(b"nope")


def _delta(sign: int, samples: list[str], Q: np.ndarray, labels: np.ndarray) -> Delta:
    n = len(samples)
    return Delta("h", "src", Q.shape[1], 30, 0,
                 [RowsEntry(sign, [f"e{i}" for i in range(n)], samples, ["u"] * n, labels, Q)])


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 5), d=st.integers(1, 6), vector=st.booleans(), seed=st.integers(0, 2**31))
def test_sealed_delta_round_trip(n: int, d: int, vector: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    Q = rng.integers(-(2**40), 2**40, size=(n, d))
    labels = rng.integers(-(2**20), 2**20, size=(n, 3)) if vector else rng.integers(0, 9, size=n)
    samples = [f"s{i}" for i in range(n)]
    keys = {s: new_key() for s in samples}
    plain = _delta(1, samples, Q, labels)
    packed = PackedEntry(1, ["p"], ["ps"], ["u"], b"blob")
    sealed = seal_delta(Delta("h", "src", d, 30, 0, (*plain.entries, packed)), lambda h, s: keys[s])
    raw = encode_delta(sealed)
    for row in Q:
        assert row.astype("<i8").tobytes() not in raw
    back = decode_delta(raw)
    assert back == sealed and isinstance(back.entries[0], SealedRowsEntry)
    opened = open_delta(back, lambda h, s, kid: keys[s] if keys[s].key_id == kid else None)
    assert opened.erased == [] and opened.delta.entries[0] == plain.entries[0]
    assert opened.delta.entries[1] == packed
    # a destroyed key: the row is reported erased with its commitment, the others open
    gone = samples[0]
    partial = open_delta(back, lambda h, s, kid: None if s == gone else keys[s])
    assert [e.sample_id for e in partial.erased] == [gone]
    assert partial.erased[0].commitment == back.entries[0].commitments[0]  # type: ignore[union-attr]
    if n > 1:
        assert partial.delta.entries[0].sample_ids == tuple(samples[1:])


def test_add_and_delete_share_commitments() -> None:
    Q = np.array([[1, 2, 3]])
    keys = {"s": new_key()}
    add = seal_delta(_delta(1, ["s"], Q, np.array([4])), lambda h, s: keys[s]).entries[0]
    rm = seal_delta(_delta(-1, ["s"], Q, np.array([4])), lambda h, s: keys[s]).entries[0]
    assert isinstance(add, SealedRowsEntry) and isinstance(rm, SealedRowsEntry)
    assert add.commitments == rm.commitments and add.ciphertexts != rm.ciphertexts


def test_wrong_commitment_and_bad_sizes_refused() -> None:
    keys = {"s": new_key()}
    e = seal_delta(_delta(1, ["s"], np.array([[1, 2]]), np.array([0])), lambda h, s: keys[s]).entries[0]
    assert isinstance(e, SealedRowsEntry)
    forged = SealedRowsEntry(e.sign, e.event_ids, e.sample_ids, e.subject_ids, e.label_kind, e.c, e.key_ids,
                             (bytes(32),), e.ciphertexts)
    with pytest.raises(SealError, match="commitment"):
        open_delta(Delta("h", "src", 2, 30, 0, [forged]), lambda h, s, k: keys[s])
    short = SealedRowsEntry(e.sign, e.event_ids, e.sample_ids, e.subject_ids, e.label_kind, e.c, e.key_ids,
                            e.commitments, (e.ciphertexts[0][:-1],))
    with pytest.raises(CodecError, match="sealed row"):
        encode_delta(Delta("h", "src", 2, 30, 0, [short]))
    raw = encode_delta(Delta("h", "src", 2, 30, 0, [e]))
    assert raw[4:6] == b"\x01\x00"  # one delta version, sealed entries included


def test_raw_input_topics_get_the_configured_retention() -> None:
    from unlearn.infra.settings import Settings
    from unlearn.infra.topics import raw_input_config

    assert raw_input_config(Settings()) == {}
    assert raw_input_config(Settings().with_(requests_retention_ms=3_600_000)) == {"retention.ms": "3600000"}
    # where the featurizer trims them (DeleteRecords), segments roll so trimmed bytes leave the disk
    assert raw_input_config(Settings().with_(profile="kafka", segment_ms=30_000)) == {"segment.ms": "30000"}
    assert raw_input_config(Settings().with_(profile="kafka", trim_every_seconds=0)) == {}
    with pytest.raises(ValueError, match="REQUESTS_RETENTION_MS"):
        Settings().with_(requests_retention_ms=0)
