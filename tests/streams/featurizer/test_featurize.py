"""``featurize_batch`` (streams/featurizer/featurize.py): decisions on micro-batches, step by step and
whole, no broker, no sqlite. Its helpers (``MemCache``, ``cfg``, ``batch``...) serve the other
core tests too."""

from __future__ import annotations

import io
import time

import numpy as np
import orjson
import pytest

from unlearn.features.backbones import BackboneError, EncodeResult
from unlearn.features.contract import quantize_feature_row
from unlearn.infra.settings import HeadSettings
from unlearn.ledger import ExactLedger, MultisetHash, Quantizer, l2_normalize
from unlearn.schemas.deadletter import decode_deadletter
from unlearn.schemas.delta_codec import PackedEntry, RowsEntry, decode_delta
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.receipts import decode_receipt
from unlearn.schemas.redaction import redact_original
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.schemas.request_inputs import FeaturesInput, ImageInput, TextInput
from unlearn.schemas.source_id import format_source_id, parse_source, parse_source_id, source_stream
from unlearn.streams.featurizer.add_encoding import RegistryEncoder, encode_adds, route_adds
from unlearn.streams.featurizer.batch_io import InMessage
from unlearn.streams.featurizer.cache_view import CachedSample, CacheMutations, HeadInfo
from unlearn.streams.featurizer.core_config import CoreConfig
from unlearn.streams.featurizer.delta_assembly import assemble_deltas
from unlearn.streams.featurizer.featurize import check_batch, featurize_batch, parse_batch
from unlearn.streams.featurizer.judge import judge_batch
from unlearn.streams.featurizer.tombstones import Tombstone

K = 30


# --------------------------------------------------------------------------- helpers
class MemCache:
    """A dict-backed CacheView that applies CacheMutations (what FeatureCache does durably)."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str], CachedSample] = {}
        self.heads: dict[str, HeadInfo] = {}
        self.tombs: dict[tuple[str, str, str, str, str], Tombstone] = {}

    def get_sample(self, head_id: str, sample_id: str) -> CachedSample | None:
        return self.samples.get((head_id, sample_id))

    def subject_samples(self, head_id: str, subject_id: str) -> list[CachedSample]:
        return sorted((s for (h, _), s in self.samples.items() if h == head_id and s.subject_id == subject_id),
                      key=lambda s: s.sample_id)

    def get_head(self, head_id: str) -> HeadInfo | None:
        return self.heads.get(head_id)

    def tombstones(self, head_id: str, kind: str, id_: str, subject_id: str) -> list[Tombstone]:
        return [t for k, t in sorted(self.tombs.items()) if k[:4] == (head_id, kind, id_, subject_id)]

    def apply(self, m: CacheMutations) -> None:
        for h in m.put_heads:
            self.heads[h.head_id] = h
        for key in m.drop_samples:
            self.samples.pop(key, None)
        for s in m.put_samples:
            self.samples[(s.head_id, s.sample_id)] = s
        for k in m.drop_tombstones:
            self.tombs.pop(k, None)
        for t in m.put_tombstones:
            self.tombs[t.key] = t


def cfg(**kw: object) -> CoreConfig:
    base = dict(requests_topic="t.requests", deltas_topic="t.deltas", deadletter_topic="t.deadletter",
                receipts_topic="t.receipts")
    base.update(kw)
    return CoreConfig(**base)  # type: ignore[arg-type]


def add(ev: str, head: str, subj: str, sample: str, values, label=0, client: str = "c1") -> bytes:
    return encode_request(Request(ev, "add", head, client, subj, sample, label,
                                  FeaturesInput(tuple(float(v) for v in values))))


def delete(ev: str, head: str, subj: str, sample: str, client: str = "c1") -> bytes:
    return encode_request(Request(ev, "delete", head, client, subj, sample))


def delete_subject(ev: str, head: str, subj: str, client: str = "c1") -> bytes:
    return encode_request(Request(ev, "delete_subject", head, client, subj))


def raw(**d: object) -> bytes:
    return orjson.dumps({"schema": "unlearn.request/v1", **d})


T0_MS = int(time.time() * 1000) - 60_000  # record timestamps: a minute ago, one ms per offset


def batch(*values: bytes | None, start: int = 0, partition: int = 0, stamped: bool = False) -> list[InMessage]:
    """Records in offset order; ``stamped``: each timestamped one ms after the one before (the
    event time of a request without ``ts``; unstamped records are dated at the batch's clock)."""
    return [InMessage(partition, start + i, v, b"key%d" % i, timestamp_ms=T0_MS + start + i if stamped else None)
            for i, v in enumerate(values)]


def ref_q(values) -> np.ndarray:
    return Quantizer(K, 1.0).quantize(l2_normalize(np.asarray(values, dtype=np.float64)))[0]


def apply_delta(ledgers: dict[str, ExactLedger], delta) -> None:
    led = ledgers.setdefault(delta.head_id, ExactLedger(delta.d, 0, delta.frac_bits, delta.label_frac_bits))
    for e in delta.entries:
        if isinstance(e, RowsEntry):
            (led.add if e.sign > 0 else led.delete)(e.q, e.labels)
        else:
            led.absorb(ExactLedger.from_bytes(e.ledger_blob), e.sign)


def no_encoder(name, items):  # features never reach the encoder
    raise AssertionError(f"encoder called for {name}")


# --------------------------------------------------------------------------- source ids
def test_source_id_convention() -> None:
    assert format_source_id(3, 41) == "requests/3@41"
    assert parse_source_id("requests/3@41") == (3, 41)
    assert parse_source("requests/3@41") == ("requests", 3, 41)
    assert parse_source("requests.site-a[c/1@x]/0@7") == ("requests.site-a[c/1@x]", 0, 7)
    for bad in ("requests/3", "requests@3", "/3@4", "requests/x@4", "requests/-1@4", "", None):
        assert parse_source_id(bad) is None  # type: ignore[arg-type]
    assert source_stream("unlearn.requests", "unlearn.") == "requests"
    assert source_stream("unlearn.requests", "unlearn.", client_id="hospital-7") == "requests[hospital-7]"
    assert source_stream("site.requests", "unlearn.") == "site.requests"
    with pytest.raises(ValueError):
        format_source_id(-1, 0)


# --------------------------------------------------------------------------- valid flows
def test_adds_give_rows_equal_to_quantizer_on_l2_normalized_inputs() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 5)) * 3
    labels = [0, 2, 1, 2, 0, 1]
    cache = MemCache()
    out = featurize_batch(batch(*(add(f"e{i}", "h", f"s{i % 2}", f"x{i}", X[i], labels[i]) for i in range(6)),
                                start=10),
                          cache, cfg(), no_encoder, now=123.0)
    assert out.deadletters == [] and out.receipts == [] and out.accepted == 6 and out.rows == 6
    assert out.last_offset == 15 and out.partition == 0
    (delta,) = out.deltas
    assert ((delta.head_id, delta.source_id, delta.d, delta.frac_bits, delta.label_frac_bits)
            == ("h", "requests/0@15", 5, K, 0))
    (entry,) = delta.entries
    assert isinstance(entry, RowsEntry) and entry.sign == 1
    assert entry.event_ids == tuple(f"e{i}" for i in range(6))
    assert entry.sample_ids == tuple(f"x{i}" for i in range(6))
    assert entry.subject_ids == ("s0", "s1") * 3
    np.testing.assert_array_equal(entry.labels, labels)
    expected = np.stack([ref_q(X[i]) for i in range(6)])
    np.testing.assert_array_equal(entry.q, expected)
    # the batched form of the same reference agrees (normalization is row-wise)
    np.testing.assert_array_equal(entry.q, Quantizer(K).quantize(l2_normalize(X)))
    # cache mutations: the head and six samples with their exact q
    assert out.mutations.put_heads == (HeadInfo("h", "features", "features", 5, "class", 0, K, 0),)
    assert {s.sample_id for s in out.mutations.put_samples} == {f"x{i}" for i in range(6)}
    assert out.mutations.drop_samples == ()
    # public helper gives the same q
    np.testing.assert_array_equal(quantize_feature_row(X[0], K), expected[0])


def test_binary_features_give_the_rows_of_their_values_and_share_a_head_with_json() -> None:
    """features_bin '<f8' gives the rows JSON numbers give; '<f4' the rows of its float32 values;
    all three encodings feed one head (its input kind is ``features``); bad bytes are refused."""
    X = np.random.default_rng(7).normal(size=(6, 768))
    adds = []
    for i in range(6):
        dtype = (None, "<f8", "<f4")[i % 3]
        adds.append(encode_request(Request(f"e{i}", "add", "h", "c1", "s", f"x{i}", i % 2, FeaturesInput(X[i], dtype))))
    nan = encode_request(Request("e-nan", "add", "h", "c1", "s", "x-nan", 0, FeaturesInput(X[0], "<f8")))
    nan = nan.replace(orjson.loads(nan)["input"]["data"][:12].encode(), b"AAAAAAAA+H8A")  # first value: a NaN
    short = raw(event_id="e-short", op="add", head_id="h", client_id="c1", subject_id="s", sample_id="x-short",
                label=0, input={"kind": "features_bin", "dtype": "<f8", "data": "AAAAAAAA4D8AAAA="})
    out = featurize_batch(batch(*adds, nan, short), MemCache(), cfg(), no_encoder)
    assert out.accepted == 6 and out.reasons() == {"non_finite_feature": 1, "bad_features": 1}
    (delta,) = out.deltas
    (entry,) = delta.entries
    assert isinstance(entry, RowsEntry)
    want = [ref_q(X[i].astype(np.float32) if i % 3 == 2 else X[i]) for i in range(6)]
    np.testing.assert_array_equal(entry.q, np.stack(want))
    assert out.mutations.put_heads == (HeadInfo("h", "features", "features", 768, "class", 0, K, 0),)
    # float32 rounding moves q: the '<f4' row is not the float64 vector's
    assert not np.array_equal(entry.q[2], ref_q(X[2]))


def test_delete_and_delete_subject_use_the_cached_q_and_label() -> None:
    cache = MemCache()
    cache.heads["h"] = HeadInfo("h", "features", "features", 3, "class", 0, K, 0)
    cache.heads["g"] = HeadInfo("g", "features", "features", 3, "class", 0, K, 0)
    # cached q values that no raw input could produce: a delete must use them verbatim
    for sample, subj, head, q, y in [("a", "s1", "h", [1, 2, 3], 4), ("c", "s1", "h", [7, 8, 9], 0),
                                     ("b", "s1", "h", [4, 5, 6], 1), ("d", "s2", "h", [0, 0, 1], 2),
                                     ("e", "s1", "g", [3, 3, 3], 5)]:
        cache.samples[(head, sample)] = CachedSample(head, sample, subj, "c1", f"add-{sample}", y,
                                                     np.array(q, np.int64))
    out = featurize_batch(batch(delete("del-d", "h", "s2", "d"), delete_subject("forget-s1", "h", "s1")),
                          cache, cfg(), no_encoder)
    assert out.deadletters == [] and out.accepted == 2 and out.rows == 4
    (delta,) = out.deltas
    one, subject = delta.entries  # a delete_subject's rows are an entry of their own (subject tombstones)
    assert (one.sign, one.by_subject, subject.sign, subject.by_subject) == (-1, False, -1, True)
    assert one.event_ids + subject.event_ids == ("del-d", "forget-s1", "forget-s1", "forget-s1")
    assert one.sample_ids + subject.sample_ids == ("d", "a", "b", "c")  # subject's samples ordered by sample id
    assert one.subject_ids + subject.subject_ids == ("s2", "s1", "s1", "s1")
    np.testing.assert_array_equal(np.concatenate([one.q, subject.q]), [[0, 0, 1], [1, 2, 3], [4, 5, 6], [7, 8, 9]])
    np.testing.assert_array_equal(np.concatenate([one.labels, subject.labels]), [2, 4, 1, 0])
    assert set(out.mutations.drop_samples) == {("h", "a"), ("h", "b"), ("h", "c"), ("h", "d")}
    assert out.mutations.put_samples == ()
    cache.apply(out.mutations)
    assert list(cache.samples) == [("g", "e")]  # the other head keeps the subject's sample


def test_add_then_delete_in_one_batch_and_delete_then_readd() -> None:
    cache = MemCache()
    out1 = featurize_batch(batch(add("e1", "h", "s", "x", [3, 4], 1), add("e2", "h", "s", "y", [1, 0], 0),
                                 delete("e3", "h", "s", "x"), stamped=True), cache, cfg(), no_encoder)
    assert out1.deadletters == []
    (d1,) = out1.deltas
    assert [(e.sign, e.sample_ids) for e in d1.entries] == [(1, ("x", "y")), (-1, ("x",))]
    np.testing.assert_array_equal(d1.entries[1].q[0], d1.entries[0].q[0])  # the same q leaves
    cache.apply(out1.mutations)
    assert set(cache.samples) == {("h", "y")}
    # delete y then add y again (new features) in one batch: -old q, +new q
    old_q = cache.samples[("h", "y")].q.copy()
    out2 = featurize_batch(batch(delete("e4", "h", "s", "y"), add("e5", "h", "s", "y", [0, 2], 1), start=3,
                                 stamped=True), cache, cfg(), no_encoder)
    assert out2.deadletters == []
    (d2,) = out2.deltas
    assert [(e.sign, e.event_ids) for e in d2.entries] == [(1, ("e5",)), (-1, ("e4",))]
    np.testing.assert_array_equal(d2.entries[1].q[0], old_q)
    np.testing.assert_array_equal(d2.entries[0].q[0], ref_q([0, 2]))
    cache.apply(out2.mutations)
    np.testing.assert_array_equal(cache.samples[("h", "y")].q, ref_q([0, 2]))


def test_vector_labels_quantized_with_label_frac_bits_and_entry_order() -> None:
    cache = MemCache()
    c = cfg(heads=HeadSettings(label_frac_bits=8))
    out = featurize_batch(batch(add("e1", "soft", "s", "a", [1, 2], [0.5, -0.25]),
                                add("e2", "hard", "s", "b", [2, 1], 3),
                                add("e3", "soft", "s", "b", [1, 1], [1.0, 0.0])), cache, c, no_encoder)
    assert out.deadletters == []
    soft, hard = out.deltas  # heads in order of first appearance
    assert soft.head_id == "soft" and soft.label_frac_bits == 8
    np.testing.assert_array_equal(soft.entries[0].labels, [[128, -64], [256, 0]])
    np.testing.assert_array_equal(hard.entries[0].labels, [3])
    cache.apply(out.mutations)
    out2 = featurize_batch(batch(delete("e4", "soft", "s", "a"), add("e5", "soft", "s", "c", [1, 3], [0.0, 1.0]),
                                 start=3), cache, c, no_encoder)
    (d,) = out2.deltas
    assert [(e.sign, e.labels.shape) for e in d.entries] == [(1, (1, 2)), (-1, (1, 2))]
    np.testing.assert_array_equal(d.entries[1].labels, [[128, -64]])
    # label_frac_bits = 0: integer vectors are fine, soft ones are refused
    out3 = featurize_batch(batch(add("e1", "v", "s", "a", [1], [2.0, -1.0]), add("e2", "v", "s", "b", [1], [0.5, 0.5])),
                           MemCache(), cfg(), no_encoder)
    assert out3.reasons() == {"soft_label_needs_label_frac_bits": 1}
    np.testing.assert_array_equal(out3.deltas[0].entries[0].labels, [[2, -1]])


# --------------------------------------------------------------------------- rejections
def test_bad_events_go_to_deadletter_and_the_batch_proceeds() -> None:
    cache = MemCache()
    first = featurize_batch(batch(add("e0", "h", "s1", "old", [1, 1, 0], 1)), cache, cfg(), no_encoder, now=5.0)
    cache.apply(first.mutations)
    values = [
        add("ok1", "h", "s1", "n1", [0, 1, 0], 0),                      # 1 ok
        add("dup", "h", "s1", "old", [1, 0, 0], 0),                     # 2 duplicate_add (cached)
        add("ok2", "h", "s2", "n2", [0, 0, 2], 2),                      # 3 ok
        add("dup2", "h", "s2", "n2", [0, 0, 3], 2),                     # 4 duplicate_add (same batch)
        delete("unk", "h", "s1", "nope"),                               # 5 not cached: tombstoned
        add("dim", "h", "s1", "n3", [1, 2], 0),                         # 6 dimension_mismatch
        raw(event_id="neg", op="add", head_id="h", client_id="c1", subject_id="s1", sample_id="n4",
            label=-1, input={"kind": "features", "values": [1, 2, 3]}),  # 7 bad_label (envelope)
        b"{not json",                                                   # 8 not_json
        add("lab", "h", "s1", "n5", [1, 2, 3], [1.0, 0.0]),             # 9 label_mismatch
        delete_subject("nosub", "h", "ghost"),                          # 10 nothing cached: tombstoned
        delete("wrongsub", "h", "s2", "old"),                           # 11 subject_mismatch
        add("huge", "h", "s1", "n6", [1e300, 1e300, 0], 0),             # 12 non_finite_feature (norm)
        add("cls", "h", "s1", "n7", [1, 0, 0], 2**20),                  # 13 label_out_of_range
        raw(event_id="bad-del", op="delete", head_id="h", client_id="c1", subject_id="s9",
            sample_id="x", label=1),                                    # 14 unexpected_field -> receipt
        None,                                                           # 15 tombstone -> not_json
        delete("ok3", "h", "s1", "old"),                                # 16 ok
    ]
    out = featurize_batch(batch(*values, start=100), cache, cfg(), no_encoder, now=5.0)
    got = [(d.offset, d.reason) for d in out.deadletters]
    assert got == [(101, "duplicate_add"), (103, "duplicate_add"),
                   (105, "dimension_mismatch"), (106, "bad_label"), (107, "not_json"), (108, "label_mismatch"),
                   (110, "subject_mismatch"), (111, "non_finite_feature"),
                   (112, "label_out_of_range"), (113, "unexpected_field:label"), (114, "not_json")]
    for d in out.deadletters:
        assert d.stage == "featurizer" and d.topic == "t.requests" and d.partition == 0 and d.ts == 5.0
        assert d.original == redact_original(values[d.offset - 100] or b"") and d.key == b"key%d" % (d.offset - 100)
        assert d.detail
    # a refused plaintext add keeps its envelope, not its input (UNLEARN_DEADLETTER_INPUTS=redact) ...
    dim = orjson.loads(out.deadletters[2].original)
    assert dim["input"] == {"kind": "features", "redacted": True} and dim["event_id"] == "dim"
    assert out.deadletters[4].original == b"{not json"  # nothing to attribute: kept
    # ... and all of it with UNLEARN_DEADLETTER_INPUTS=keep
    kept = featurize_batch(batch(*values, start=100), cache, cfg(redact_deadletter_inputs=False), no_encoder, now=5.0)
    assert [d.original for d in kept.deadletters] == [values[d.offset - 100] or b"" for d in kept.deadletters]
    assert out.deadletters[0].event_id == "dup" and out.deadletters[4].event_id is None
    # the good events went through
    (delta,) = out.deltas
    assert delta.source_id == "requests/0@115"
    assert [(e.sign, e.event_ids) for e in delta.entries] == [(1, ("ok1", "ok2")), (-1, ("ok3",))]
    assert out.accepted == 3
    # rejected receipts for refused deletes (also the malformed one that names its ids); deletes
    # that removed nothing are tombstoned (their tombstones keep older adds out)
    assert [(r.event_id, r.status, r.reason, r.sample_ids) for r in out.receipts] == [
        ("unk", "tombstoned", None, ("nope",)),
        ("nosub", "tombstoned", None, ()),
        ("wrongsub", "rejected", "subject_mismatch", ("old",)),
        ("bad-del", "rejected", "unexpected_field:label", ("x",)),
    ]
    # messages encode and decode; keys: head id / original key / subject id
    msgs = out.messages(cfg())
    assert [m.topic for m in msgs] == ["t.deltas"] + ["t.deadletter"] * 11 + ["t.receipts"] * 4
    assert msgs[0].key == b"h" and decode_delta(msgs[0].value).source_id == "requests/0@115"
    assert decode_deadletter(msgs[1].value).reason == "duplicate_add"
    assert msgs[-1].key == b"s9" and decode_receipt(msgs[-1].value).reason == "unexpected_field:label"


def test_head_dimension_backbone_overrides_and_limits() -> None:
    c = cfg(head_backbones={"fixed": "features:4", "txt": "minilm", "bogus": "no-such-model"},
            heads=HeadSettings(max_feature_dim=8))
    out = featurize_batch(batch(
        add("a", "fixed", "s", "1", [1, 2, 3], 0),          # backbone says d=4
        add("b", "txt", "s", "1", [1, 2, 3], 0),            # minilm takes text
        add("c", "bogus", "s", "1", [1, 2, 3], 0),          # unknown backbone
        add("d", "big", "s", "1", list(range(1, 10)), 0),   # d=9 > max_dim
        add("e", "fixed", "s", "2", [1, 2, 3, 4], 0),       # ok
    ), MemCache(), c, no_encoder)
    assert [(d.event_id, d.reason) for d in out.deadletters] == [
        ("a", "dimension_mismatch"), ("b", "backbone_mismatch"), ("c", "backbone_unavailable"),
        ("d", "dimension_too_large")]
    (delta,) = out.deltas
    assert delta.head_id == "fixed" and delta.d == 4
    assert out.mutations.put_heads[0].backbone == "features:4"


def text_vec(t: str) -> np.ndarray:
    v = np.zeros(384, np.float32)
    v[:3] = [len(t), 1.0, 0.5]
    return v


def fake_text_encoder(calls: list):
    def enc(name, items):
        calls.append((name, list(items)))
        ok, feats, errors = [], [], {}
        for i, t in enumerate(items):
            if t == "BAD":
                errors[i] = BackboneError("empty text", index=i)
            elif t == "CRASH":
                raise RuntimeError("model blew up")
            else:
                ok.append(i)
                feats.append(text_vec(t))
        return EncodeResult(np.asarray(feats, np.float32).reshape(-1, 384), np.asarray(ok, np.int64), errors)
    return enc


def text_add(ev: str, head: str, sample: str, text: str) -> bytes:
    return encode_request(Request(ev, "add", head, "c1", "s", sample, 1, TextInput(text)))


def test_encoder_errors_are_per_item() -> None:
    calls: list = []
    enc = fake_text_encoder(calls)
    out = featurize_batch(batch(text_add("t1", "tw", "1", "hello"), text_add("t2", "tw", "2", "BAD"),
                                text_add("t3", "tw", "3", "CRASH"), text_add("t4", "tw", "4", "hi"),
                                add("f1", "tw", "s", "5", [1, 2, 3], 1)),  # features on a text head
                          MemCache(), cfg(), enc)
    assert calls[0] == ("minilm", ["hello", "BAD", "CRASH", "hi"])  # one batched call per backbone
    assert [(d.event_id, d.reason) for d in out.deadletters] == [
        ("t2", "undecodable_input"), ("t3", "encode_failed"), ("f1", "backbone_mismatch")]
    (delta,) = out.deltas
    assert delta.entries[0].event_ids == ("t1", "t4") and delta.d == 384
    np.testing.assert_array_equal(delta.entries[0].q[0], ref_q(text_vec("hello")))
    assert out.mutations.put_heads[0].backbone == "minilm" and out.mutations.put_heads[0].input_kind == "text"
    # a failure of every input is systemic: raise instead of dead-lettering everything
    with pytest.raises(RuntimeError):
        featurize_batch(batch(text_add("t1", "tw", "1", "CRASH"), text_add("t2", "tw", "2", "CRASH")),
                        MemCache(), cfg(), enc)

    def unavailable(name, items):
        raise BackboneError("weights missing")

    out = featurize_batch(batch(text_add("t1", "tw", "1", "hello"), add("f", "h", "s", "1", [1, 0], 0)),
                          MemCache(), cfg(), unavailable)
    assert out.reasons() == {"backbone_unavailable": 1} and out.deltas[0].head_id == "h"


def test_real_image_backbone_small_case() -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray((np.arange(28 * 28).reshape(28, 28) % 251).astype(np.uint8)).save(buf, "PNG")
    png = buf.getvalue()

    def img_add(ev: str, sample: str, data: bytes) -> bytes:
        return encode_request(Request(ev, "add", "faces", "c1", "s", sample, 3, ImageInput(data)))

    loads: list[int] = []
    enc = RegistryEncoder("cpu", on_load=lambda: loads.append(1))  # the CLI freezes the heap there
    out = featurize_batch(batch(img_add("i1", "1", png), img_add("i2", "2", b"\x89PNG not really")),
                          MemCache(), cfg(), enc)
    assert out.reasons() == {"undecodable_input": 1}
    featurize_batch(batch(img_add("i3", "3", png)), MemCache(), cfg(), enc)
    assert loads == [1]  # once per backbone, not per batch
    (delta,) = out.deltas
    assert delta.d == 1280 and delta.entries[0].event_ids == ("i1",)
    from unlearn.features.backbones import get_backbone

    f = get_backbone("efficientnet-lite0", "cpu").encode([png])[0]
    np.testing.assert_array_equal(delta.entries[0].q[0], ref_q(f))
    assert out.mutations.put_heads[0].backbone == "efficientnet-lite0@112px"


# --------------------------------------------------------------------------- federated
def _stream_of_requests(client: str = "c1") -> list[list[bytes]]:
    rng = np.random.default_rng(7)
    X = rng.normal(size=(12, 4))
    b1 = [add(f"a{i}", "h", f"s{i % 3}", f"x{i}", X[i], int(i % 3), client) for i in range(8)]
    b1.append(delete("d0", "h", "s0", "x0", client))
    b2 = [add(f"a{i}", "h", f"s{i % 3}", f"x{i}", X[i], int(i % 4), client) for i in range(8, 12)]
    b2 += [delete_subject("ds1", "h", "s1", client), delete("d2", "h", "s2", "x2", client),
           add("a-re", "h", "s0", "x0", X[0] * 2, 1, client)]
    return [b1, b2]


def test_federated_packed_deltas_give_the_same_digest_as_rows() -> None:
    digests, hashes = {}, {}
    for federated in (False, True):
        cache, ledgers, offset = MemCache(), {}, 0
        mset = MultisetHash(4)
        c = cfg(federated=federated, client_id="c1" if federated else None,
                stream="requests[c1]" if federated else "requests")
        for b in _stream_of_requests():
            out = featurize_batch(batch(*b, start=offset), cache, c, no_encoder)
            assert out.deadletters == []
            offset += len(b)
            for d in out.deltas:
                kinds = {type(e) for e in d.entries}
                assert kinds == ({PackedEntry} if federated else {RowsEntry})
                assert parse_source(d.source_id)[0] == c.stream
                decoded = decode_delta(out.messages(c)[0].value)
                apply_delta(ledgers, decoded)
                for e in decoded.entries:  # a packed entry carries its rows' multiset hash
                    if isinstance(e, PackedEntry):
                        assert e.multiset_hash is not None
                        mset.absorb(MultisetHash.from_bytes(e.multiset_hash, 4), e.sign)
                    else:
                        (mset.add if e.sign > 0 else mset.delete)(e.q, e.labels)
            cache.apply(out.mutations)
        digests[federated] = ledgers["h"].digest()
        hashes[federated] = mset
        # from scratch on the retained set (what the cache holds)
        kept = sorted(cache.samples.values(), key=lambda s: s.sample_id)
        ref = ExactLedger.from_rows(np.stack([s.q for s in kept]), np.array([s.label for s in kept]),
                                    n_outputs=ledgers["h"].n_outputs)
        assert ledgers["h"].digest() == ref.digest()
        assert mset == MultisetHash.of_rows(np.stack([s.q for s in kept]), np.array([s.label for s in kept]))
    assert digests[False] == digests[True] and hashes[False] == hashes[True]


def test_federated_site_serves_one_client() -> None:
    c = cfg(federated=True, client_id="c1", stream="requests[c1]")
    out = featurize_batch(batch(add("a", "h", "s", "1", [1, 0], 0, client="c1"),
                                add("b", "h", "s", "2", [1, 0], 0, client="c2"),
                                delete("c", "h", "s", "1", client="c2")), MemCache(), c, no_encoder)
    assert [(d.event_id, d.reason) for d in out.deadletters] == [("b", "wrong_client"), ("c", "wrong_client")]
    assert [r.event_id for r in out.receipts] == ["c"]
    (delta,) = out.deltas
    (entry,) = delta.entries
    assert isinstance(entry, PackedEntry) and entry.event_ids == ("a",)
    led = ExactLedger.from_bytes(entry.ledger_blob)
    assert led.count == 1 and led.dim == 2
    with pytest.raises(ValueError):
        cfg(federated=True)


def test_batch_preconditions() -> None:
    with pytest.raises(ValueError):
        featurize_batch([], MemCache(), cfg(), no_encoder)
    with pytest.raises(ValueError):
        featurize_batch([InMessage(0, 1, b"{}"), InMessage(1, 2, b"{}")], MemCache(), cfg(), no_encoder)
    with pytest.raises(ValueError):
        featurize_batch([InMessage(0, 2, b"{}"), InMessage(0, 2, b"{}")], MemCache(), cfg(), no_encoder)


def test_oversized_row_deltas_go_packed_and_huge_deadletters_are_truncated() -> None:
    values = [add(f"e{i}", "h", "s", f"x{i}", [i + 1, 1, 2, 3], i % 2) for i in range(10)]
    values.append(delete("d", "h", "s", "x3"))
    as_rows = featurize_batch(batch(*values), MemCache(), cfg(), no_encoder)
    # 11 rows * (4 + 1) * 8 = 440 bytes of rows > half the message limit -> packed for this head
    as_packed = featurize_batch(batch(*values), MemCache(), cfg(max_message_bytes=800), no_encoder)
    assert all(isinstance(e, RowsEntry) for e in as_rows.deltas[0].entries)
    assert all(isinstance(e, PackedEntry) for e in as_packed.deltas[0].entries)
    digests = []
    for out in (as_rows, as_packed):
        ledgers: dict[str, ExactLedger] = {}
        apply_delta(ledgers, out.deltas[0])
        digests.append(ledgers["h"].digest())
    assert digests[0] == digests[1]
    # a dead letter never exceeds the message limit (the original is cut, the detail says so)
    out = featurize_batch(batch(b"[" * 50_000), MemCache(), cfg(max_message_bytes=20_000), no_encoder)
    (msg,) = out.messages(cfg(max_message_bytes=20_000))
    rec = decode_deadletter(msg.value)
    assert len(msg.value) <= 20_000 and "truncated from 50000" in rec.detail and rec.reason == "not_json"


# --------------------------------------------------------------------------- the steps, one by one
def test_steps_parse_encode_judge_assemble() -> None:
    """featurize_batch is check -> parse -> encode -> judge -> assemble; each step on its own."""
    msgs = batch(add("a", "h", "s", "x", [3, 4], 1), b"not json", delete("d", "h", "s", "x"),
                 delete("d2", "h", "s", "gone"), start=7)
    assert check_batch(msgs) == 0
    reqs = parse_batch(msgs)
    assert isinstance(reqs[1], InvalidRequest) and reqs[1].reason == "not_json"
    assert [r.op for r in reqs if isinstance(r, Request)] == ["add", "delete", "delete"]

    encoded, groups = route_adds(reqs, cfg())
    assert groups == {} and encoded.backbones == {0: "features"}  # vectors pass through, float64
    assert encoded.features[0].dtype == np.float64
    assert encode_adds(reqs, cfg(), no_encoder).backbones == encoded.backbones

    judged = judge_batch(msgs, reqs, encoded, MemCache(), cfg(), ts=5.0)
    assert judged.accepted == 2  # the add, and the delete that sees it through the overlay
    assert [(d.offset, d.reason) for d in judged.deadletters] == [(8, "not_json")]
    assert [(r.event_id, r.status, r.tombstone_ts) for r in judged.receipts] == [("d2", "tombstoned", 5.0)]
    assert judged.overlay.mutations().drop_samples == (("h", "x"),)
    assert sorted((t.id, t.event_us) for t in judged.overlay.mutations().put_tombstones) == [
        ("gone", 5_000_000), ("x", 5_000_000)]
    assert len(judged.rows["h"]) == 2

    deltas, n_rows = assemble_deltas(judged.rows, judged.overlay, "requests/0@10", cfg())
    (delta,) = deltas
    assert n_rows == 2 and delta.source_id == "requests/0@10" and [e.sign for e in delta.entries] == [1, -1]
    np.testing.assert_array_equal(delta.entries[0].q[0], ref_q([3, 4]))
