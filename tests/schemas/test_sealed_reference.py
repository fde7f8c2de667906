"""The optimised paths of sealing and opening (issue 12) against reference implementations
written the slow way, straight from docs/formats.md: associated data, commitments, key id
checks, opening a sealed delta row by row, and the key ring's lookup without a merged dict."""

from __future__ import annotations

import hashlib
import hmac
import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.infra.between_stages import KeyGeneration, KeyRing
from unlearn.infra.settings import Settings
from unlearn.schemas.delta_codec import Delta, RowsEntry, SealedRowsEntry, decode_delta, encode_delta
from unlearn.schemas.sealed import (
    PURPOSE_ROW,
    ErasedRow,
    SampleKey,
    SealError,
    aad,
    commitment,
    new_key,
    open_delta,
    seal_delta,
    unseal,
)

text = st.text(max_size=20)  # any Unicode: the lengths are of the UTF-8 bytes
ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=12)


def _f(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<H", len(b)) + b


def ref_aad(purpose: str, head_id: str, sample_id: str, key_id: str) -> bytes:
    return b"unlearn-seal/v1\x00" + _f(purpose) + _f(head_id) + _f(sample_id) + _f(key_id)


def ref_commitment(key: SampleKey, head_id: str, sample_id: str, row: bytes) -> bytes:
    kc = hmac.new(key.key, b"unlearn-commit/v1\x00key", hashlib.sha256).digest()
    return hmac.new(kc, b"unlearn-commit/v1\x00" + _f(head_id) + _f(sample_id) + row, hashlib.sha256).digest()


def ref_open(delta: Delta, lookup: dict[tuple[str, str, str], SampleKey]) -> tuple[list[RowsEntry], list[ErasedRow]]:
    """Row by row: unseal, check the commitment, parse ``row`` as int64 LE (d + width values)."""
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
            assert ref_commitment(key, delta.head_id, e.sample_ids[i], row) == e.commitments[i]
            a = np.frombuffer(row, dtype="<i8").astype(np.int64)
            keep.append(i)
            qs.append(a[: delta.d])
            labs.append(a[delta.d:])
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
       c=st.integers(1, 3), seed=st.integers(0, 2**32 - 1), erase=st.floats(0, 1))
def test_open_delta_matches_row_by_row_reference(sizes: list[int], d: int, vector: bool, c: int, seed: int,
                                                 erase: float) -> None:
    rng = np.random.default_rng(seed)
    entries, at = [], 0
    for n in sizes:
        q = rng.integers(-(2**62), 2**62, size=(n, d), dtype=np.int64)
        lab = rng.integers(-(2**40), 2**40, size=(n, c), dtype=np.int64) if vector else rng.integers(0, 10, size=n)
        names = [f"s{at + i}" for i in range(n)]
        entries.append(RowsEntry(int(rng.choice([1, -1])), tuple(f"e{x}" for x in names), tuple(names),
                                 tuple(f"u{x}" for x in names), lab, q))
        at += n
    keys: dict[tuple[str, str], SampleKey] = {}
    sealed = decode_delta(encode_delta(seal_delta(Delta("h", "src", d, 20, 20, tuple(entries)),
                                                  lambda h, s: keys.setdefault((h, s), new_key()))))
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
