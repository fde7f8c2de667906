"""Sealing per-sample rows (schemas/sealed.py): round trips, context
binding, commitments, and the sealed deltas entry.

The optimised paths of sealing and opening (issue 12) against reference implementations
written the slow way, straight from docs/formats.md: associated data, commitments, key id
checks, opening a sealed delta row by row, and the key ring's lookup without a merged dict."""

from __future__ import annotations

import hashlib
import hmac
import struct

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.common.key_ring import KeyGeneration, KeyRing
from unlearn.infra.settings import Settings
from unlearn.ledger.quantization import QMAX as LEDGER_QMAX
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.delta_codec import Delta, PackedEntry, RowsEntry, SealedRowsEntry, decode_delta, encode_delta
from unlearn.schemas.sealed import (
    PURPOSE_CHANGELOG,
    PURPOSE_ROW,
    QMAX,
    ErasedRow,
    SampleKey,
    SealError,
    aad,
    commitment,
    decode_key_record,
    encode_key_record,
    new_key,
    open_delta,
    parse_row,
    row_bytes,
    seal,
    seal_delta,
    seal_entry,
    unseal,
    wire_row,
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
    Q = rng.integers(-(2**30), 2**30, size=(n, d), endpoint=True)
    labels = rng.integers(-(2**40), 2**40, size=(n, 3)) if vector else rng.integers(0, 9, size=n)
    samples = [f"s{i}" for i in range(n)]
    keys = {s: new_key() for s in samples}
    plain = _delta(1, samples, Q, labels)
    packed = PackedEntry(1, ["p"], ["ps"], ["u"], b"blob")
    sealed = seal_delta(Delta("h", "src", d, 30, 0, (*plain.entries, packed)), lambda h, s: keys[s])
    raw = encode_delta(sealed)
    for row in Q:
        assert row.astype("<i8").tobytes() not in raw and row.astype("<i4").tobytes() not in raw
    back = decode_delta(raw)
    assert back == sealed and isinstance(back.entries[0], SealedRowsEntry) and back.entries[0].q_itemsize == 4
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
    from unlearn.runtime.topics import raw_input_config

    assert raw_input_config(Settings()) == {}
    assert raw_input_config(Settings().with_(requests_retention_ms=3_600_000)) == {"retention.ms": "3600000"}
    # where the featurizer trims them (DeleteRecords), segments roll so trimmed bytes leave the disk
    assert raw_input_config(Settings().with_(profile="kafka", segment_ms=30_000)) == {"segment.ms": "30000"}
    assert raw_input_config(Settings().with_(profile="kafka", trim_every_seconds=0)) == {}
    with pytest.raises(ValueError, match="REQUESTS_RETENTION_MS"):
        Settings().with_(requests_retention_ms=0)

text = st.text(max_size=20)  # any Unicode: the lengths are of the UTF-8 bytes

ref_ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=12)


def _f(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<H", len(b)) + b


def ref_aad(purpose: str, head_id: str, sample_id: str, key_id: str) -> bytes:
    return b"unlearn-seal/v1\x00" + _f(purpose) + _f(head_id) + _f(sample_id) + _f(key_id)


def ref_commitment(key: SampleKey, head_id: str, sample_id: str, row: bytes) -> bytes:
    kc = hmac.new(key.key, b"unlearn-commit/v1\x00key", hashlib.sha256).digest()
    return hmac.new(kc, b"unlearn-commit/v1\x00" + _f(head_id) + _f(sample_id) + row, hashlib.sha256).digest()


def ref_seal(head_id: str, e: RowsEntry, keys: list[SampleKey], q_itemsize: int) -> SealedRowsEntry:
    """Row by row, as docs/formats.md "Sealed rows" says, no range check: the plaintext is
    ``i32[d] q`` (SEALED32, ``q_itemsize`` 4) or ``i64[d] q`` (SEALED, 4 bytes more per value:
    the layout written before issue 29), then ``i64[w] label``; the commitment is over the
    canonical ``i64[d] q || i64[w] label`` in both."""
    labels = np.asarray(e.labels)
    coms, cts = [], []
    for i, (sample, key) in enumerate(zip(e.sample_ids, keys, strict=True)):
        label = b"".join(struct.pack("<q", int(v)) for v in labels[i].reshape(-1))
        canonical = b"".join(struct.pack("<q", int(v)) for v in e.q[i]) + label
        plain = b"".join(struct.pack("<i" if q_itemsize == 4 else "<q", int(v)) for v in e.q[i]) + label
        nonce = bytes(range(12))
        coms.append(ref_commitment(key, head_id, sample, canonical))
        cts.append(nonce + AESGCM(key.key).encrypt(nonce, plain, ref_aad("delta-row", head_id, sample, key.key_id)))
    vector = labels.ndim == 2
    return SealedRowsEntry(e.sign, e.event_ids, e.sample_ids, e.subject_ids, int(vector),
                           labels.shape[1] if vector else 0, tuple(k.key_id for k in keys), tuple(coms), tuple(cts),
                           q_itemsize=q_itemsize)


def ref_open(delta: Delta, lookup: dict[tuple[str, str, str], SampleKey]) -> tuple[list[RowsEntry], list[ErasedRow]]:
    """Row by row: unseal, parse ``row`` (q as i32 or i64 LE by the entry's kind, then the label
    as i64 LE), check the commitment over the canonical (all i64) bytes."""
    entries, erased = [], []
    for e in delta.entries:
        assert isinstance(e, SealedRowsEntry)
        keep, qs, labs = [], [], []
        for i in range(e.n):
            key = lookup.get((delta.head_id, e.sample_ids[i], e.key_ids[i]))
            if key is None:
                erased.append(ErasedRow(e.sign, e.event_ids[i], e.sample_ids[i], e.subject_ids[i], e.key_ids[i],
                                        e.commitments[i]))
                continue
            row = unseal(key, PURPOSE_ROW, delta.head_id, e.sample_ids[i], e.ciphertexts[i])
            fmt = "i" if e.q_itemsize == 4 else "q"
            q = struct.unpack_from(f"<{delta.d}{fmt}", row)
            lab = struct.unpack_from(f"<{e.label_width}q", row, e.q_itemsize * delta.d)
            assert len(row) == e.q_itemsize * delta.d + 8 * e.label_width
            canonical = struct.pack(f"<{delta.d + e.label_width}q", *q, *lab)
            assert ref_commitment(key, delta.head_id, e.sample_ids[i], canonical) == e.commitments[i]
            keep.append(i)
            qs.append(np.array(q, dtype=np.int64))
            labs.append(np.array(lab, dtype=np.int64))
        if keep:
            lab = np.stack(labs)
            entries.append(RowsEntry(e.sign, tuple(e.event_ids[i] for i in keep), tuple(e.sample_ids[i] for i in keep),
                                     tuple(e.subject_ids[i] for i in keep),
                                     lab[:, 0].copy() if e.label_kind == 0 else lab, np.stack(qs)))
    return entries, erased


@settings(max_examples=200, deadline=None)
@given(purpose=text, head=text, sample=text, kid=text, row=st.binary(max_size=200))
def test_aad_and_commitment_match_the_reference(purpose: str, head: str, sample: str, kid: str, row: bytes) -> None:
    assert aad(purpose, head, sample, kid) == ref_aad(purpose, head, sample, kid)
    key = new_key()
    assert commitment(key, head, sample, row) == ref_commitment(key, head, sample, row)


@settings(max_examples=300, deadline=None)
@given(kid=st.one_of(st.text(max_size=40), st.text(alphabet="0123456789abcdefABCDEF\n", min_size=30, max_size=34)))
def test_key_id_check_matches_the_reference(kid: str) -> None:
    ok = len(kid) == 32 and all(c in "0123456789abcdef" for c in kid)
    try:
        SampleKey(kid, b"k" * 32)
    except SealError:
        assert not ok
    else:
        assert ok


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=3), d=st.integers(1, 9), vector=st.booleans(),
       c=st.integers(1, 3), seed=st.integers(0, 2**32 - 1), erase=st.floats(0, 1),
       layouts=st.lists(st.sampled_from(["seal_delta", "ref32", "ref64"]), min_size=3, max_size=3))


def test_open_delta_matches_row_by_row_reference(sizes: list[int], d: int, vector: bool, c: int, seed: int,
                                                 erase: float, layouts: list[str]) -> None:
    """Entries sealed by the product (SEALED32) or by the reference in either layout (SEALED32, or
    the i64 SEALED of old ``deltas`` topics) open as the row-by-row reference opens them."""
    rng = np.random.default_rng(seed)
    keys: dict[tuple[str, str], SampleKey] = {}
    entries, at = [], 0
    for n, layout in zip(sizes, layouts):
        q = rng.integers(-(2**30), 2**30, size=(n, d), dtype=np.int64, endpoint=True)
        lab = rng.integers(-(2**62), 2**62, size=(n, c), dtype=np.int64) if vector else rng.integers(0, 10, size=n)
        names = [f"s{at + i}" for i in range(n)]
        e = RowsEntry(int(rng.choice([1, -1])), tuple(f"e{x}" for x in names), tuple(names),
                      tuple(f"u{x}" for x in names), lab, q)
        ks = [keys.setdefault(("h", x), new_key()) for x in names]
        entries.append(seal_entry("h", e, ks) if layout == "seal_delta" else
                       ref_seal("h", e, ks, 4 if layout == "ref32" else 8))
        at += n
    sealed = decode_delta(encode_delta(Delta("h", "src", d, 20, 20, tuple(entries))))
    assert [e.q_itemsize for e in sealed.entries] == [8 if x == "ref64" else 4 for x in layouts[:len(sizes)]]
    live = {("h", s, k.key_id): k for (_, s), k in keys.items() if rng.random() >= erase}
    want, want_erased = ref_open(sealed, live)
    got = open_delta(sealed, lambda h, s, kid: live.get((h, s, kid)))
    assert got.erased == want_erased and got.sealed_rows == at
    assert len(got.delta.entries) == len(want)
    for g, w in zip(got.delta.entries, want, strict=True):
        assert isinstance(g, RowsEntry)
        assert (g.sign, g.event_ids, g.sample_ids, g.subject_ids) == (w.sign, w.event_ids, w.sample_ids, w.subject_ids)
        for a, b in ((g.q, w.q), (np.asarray(g.labels), np.asarray(w.labels))):
            assert a.dtype == b.dtype == np.int64 and a.shape == b.shape and a.flags.c_contiguous
            assert np.array_equal(a, b)


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from("xyz"), st.sampled_from("01")),
                                max_size=8), max_size=4),
       probe=st.tuples(st.sampled_from("abc"), st.sampled_from("xyz"), st.sampled_from("012")))


def test_key_ring_get_matches_the_merged_keys(parts: list[list[tuple[str, str, str]]],
                                              probe: tuple[str, str, str]) -> None:
    ring = KeyRing(Settings())
    for p, refs in enumerate(parts):  # the same ref may sit in two partitions: the later one wins
        ring.gens[p] = KeyGeneration(p, 0, f"t{p}", {r: new_key() for r in refs})
    merged = ring.keys
    for ref in [*merged, probe]:
        assert ring.get(ref) is merged.get(ref)


def _row_entry(sign: int, q: list[int], label: int = 3) -> RowsEntry:
    return RowsEntry(sign, [f"e{sign}"], ["s"], ["u"], np.array([label]), np.array([q], dtype=np.int64))


def test_the_row_bound_is_the_quantizers() -> None:
    assert QMAX == LEDGER_QMAX == 2**30 and QMAX < 2**31  # |q| <= 2^30 fits i32 (docs/design.md section 2)


def test_rows_are_sealed_as_i32_and_old_i64_rows_still_open() -> None:
    """The writer seals q as i32 (kind 4, 4 bytes less per value); a SEALED (kind 3) row of an old
    ``deltas`` topic opens to the same values; an old add and a new delete of the same row share the
    commitment (the verifier's erased-pair check holds across the change)."""
    k, q = new_key(), [QMAX, -QMAX, 0, -1, 7]
    new = seal_entry("h", _row_entry(-1, q), [k])
    old = ref_seal("h", _row_entry(1, q), [k], 8)
    assert (new.q_itemsize, old.q_itemsize) == (4, 8)
    assert len(new.ciphertexts[0]) == 12 + 4 * 5 + 8 + 16 and len(old.ciphertexts[0]) == 12 + 8 * 6 + 16
    assert new.commitments == old.commitments
    for e, kind in ((new, 4), (old, 3)):
        raw = encode_delta(Delta("h", "f", 5, 30, 0, [e]))
        assert raw[34] == kind  # the entry kind (docs/formats.md: offset 34 with ids "h", "f")
        opened = open_delta(decode_delta(raw), lambda h, s, kid: k)
        got = opened.delta.entries[0]
        assert isinstance(got, RowsEntry) and got.q.dtype == np.int64 and got.q.tolist() == [q]
        assert got.labels.tolist() == [3]
        assert encode_delta(decode_delta(raw)) == raw  # one encoding per value, either kind


@pytest.mark.parametrize(("q_itemsize", "value"), [(4, QMAX + 1), (4, -QMAX - 1), (4, 2**31 - 1), (4, -(2**31)),
                                                   (8, QMAX + 1), (8, -(2**40)), (8, 2**63 - 1)])
def test_q_beyond_2_30_is_refused_never_wrapped(q_itemsize: int, value: int) -> None:
    k = new_key()
    with pytest.raises(SealError, match=r"2\^30"):
        seal_entry("h", _row_entry(1, [1, value]), [k])
    if q_itemsize == 4 and not -(2**31) <= value < 2**31:
        return
    bad = ref_seal("h", _row_entry(1, [1, value]), [k], q_itemsize)  # a buggy or hostile writer
    with pytest.raises(SealError, match=r"2\^30"):
        open_delta(decode_delta(encode_delta(Delta("h", "f", 2, 30, 0, [bad]))), lambda h, s, kid: k)
    plain = unseal(k, PURPOSE_ROW, "h", "s", bad.ciphertexts[0])
    with pytest.raises(SealError, match=r"2\^30"):
        parse_row(plain, 2, 1, q_itemsize)
    with pytest.raises(SealError, match="bytes"):
        parse_row(plain, 2, 1, 12 - q_itemsize)  # the other layout's size


@settings(max_examples=100, deadline=None)
@given(q=st.lists(st.integers(-QMAX, QMAX), min_size=1, max_size=9),
       label=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=3))
def test_wire_row_round_trips_and_matches_the_documented_bytes(q: list[int], label: list[int]) -> None:
    raw = wire_row(np.array(q), np.array(label))
    assert raw == struct.pack(f"<{len(q)}i{len(label)}q", *q, *label)
    back_q, back_label = parse_row(raw, len(q), len(label))
    assert back_q.dtype == back_label.dtype == np.int64
    assert back_q.tolist() == q and back_label.tolist() == label
    old_q, old_label = parse_row(row_bytes(np.array(q), np.array(label)), len(q), len(label), 8)
    assert old_q.tolist() == q and old_label.tolist() == label
