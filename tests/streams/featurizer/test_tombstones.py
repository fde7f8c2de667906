"""Remove wins in event time (``streams/featurizer/tombstones.py``): the pure rule, and the
featurizer's core over random interleavings against an independent reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.features.contract import FeatureRejected
from unlearn.ledger import ExactLedger, Quantizer, l2_normalize
from unlearn.schemas.delta_codec import RowsEntry
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.request_inputs import FeaturesInput
from unlearn.streams.featurizer.batch_io import InMessage
from unlearn.streams.featurizer.core_config import CoreConfig
from unlearn.streams.featurizer.feature_cache import FeatureCache
from unlearn.streams.featurizer.featurize import featurize_batch
from unlearn.streams.featurizer.settings import FeaturizerSettings
from unlearn.streams.featurizer.tombstones import (
    Tombstone,
    TombstonePolicy,
    add_event_time,
    blocking_tombstone,
    delete_event_time,
    event_time_us,
    tombstones_of,
)

BASE = 1_700_000_000.0  # event times are BASE + small integers (seconds)
NOW = BASE + 1000.0
K = 30


def cfg(**kw: object) -> CoreConfig:
    return CoreConfig(requests_topic="t.requests", deltas_topic="t.deltas", deadletter_topic="t.deadletter",
                      receipts_topic="t.receipts", **kw)  # type: ignore[arg-type]


def add_req(ev: str, sample: str, subj: str, t: float | None, values: tuple[float, ...] = (1.0, 2.0, 2.0),
            label: int = 0, client: str = "c1") -> Request:
    return Request(ev, "add", "h", client, subj, sample, label, FeaturesInput(values), t)


# --------------------------------------------------------------------------- the pure rule
def test_event_time_is_ts_else_the_record_timestamp_else_now() -> None:
    r = add_req("a", "x", "s", 12.5)
    assert event_time_us(r, 99_000, 50.0) == 12_500_000  # ts wins
    untimed = add_req("a", "x", "s", None)
    assert event_time_us(untimed, 99_000, 50.0) == 99_000_000  # the producer's record timestamp (ms)
    assert event_time_us(untimed, None, 50.0) == event_time_us(untimed, -1, 50.0) == 50_000_000
    # a record timestamp is a whole ms: a delete takes its end, so it is never older than an add
    # dated within the same ms
    assert event_time_us(Request("d", "delete", "h", "c", "s", "x"), 99_000, 50.0) == 99_000_999
    assert event_time_us(Request("d", "delete_subject", "h", "c", "s"), 99_000, 50.0) == 99_000_999


def test_clock_bounds() -> None:
    policy = TombstonePolicy(max_skew=10, retention=100)
    now = 1000.0
    assert add_event_time(add_req("a", "x", "s", now + 10), None, now, policy) == 1_010_000_000
    with pytest.raises(FeatureRejected) as exc:
        add_event_time(add_req("a", "x", "s", now + 10.001), None, now, policy)
    assert exc.value.reason == "ts_in_future"
    assert add_event_time(add_req("a", "x", "s", now - 100), None, now, policy) == 900_000_000
    with pytest.raises(FeatureRejected) as exc:
        add_event_time(add_req("a", "x", "s", now - 100.5), None, now, policy)
    assert exc.value.reason == "event_too_old"
    # retention 0: nothing is too old, nothing expires
    forever = TombstonePolicy(max_skew=10, retention=0)
    assert add_event_time(add_req("a", "x", "s", 0.0), None, now, forever) == 0
    assert forever.horizon_us(10**15) is None and policy.horizon_us(1_000_000_000) == 900_000_000
    # a delete is never refused for its clock: its tombstone is dated at most now + skew
    far = Request("d", "delete", "h", "c1", "s", "x", ts=now + 10_000)
    assert delete_event_time(far, None, now, policy) == 1_010_000_000
    with pytest.raises(ValueError):
        TombstonePolicy(max_skew=-1)


def test_blocking_tombstone_matches_head_subject_sample_and_client() -> None:
    r = add_req("a", "x", "s", 5.0, client="app")
    t = 5_000_000
    sample = Tombstone("h", "sample", "x", "s", "", t, "d1")
    assert blocking_tombstone(r, t, [sample]) == sample  # not later: refused
    assert blocking_tombstone(r, t + 1, [sample]) is None  # later: a re-add
    subject = Tombstone("h", "subject", "s", "s", "", t + 7, "d2")
    assert blocking_tombstone(r, t + 1, [sample, subject]) == subject
    others = [Tombstone("g", "sample", "x", "s", "", t, "o"), Tombstone("h", "sample", "y", "s", "", t, "o"),
              Tombstone("h", "sample", "x", "other", "", t, "o"), Tombstone("h", "sample", "x", "s", "c2", t, "o")]
    assert blocking_tombstone(r, 0, others) is None  # another head, sample, subject or (signed) client
    assert blocking_tombstone(r, 0, [Tombstone("h", "sample", "x", "s", "app", t, "own")]) is not None
    (ts,) = tombstones_of(Request("d", "delete_subject", "h", "c", "s"), "", 3)
    assert (ts.kind, ts.id, ts.subject_id, ts.event_us) == ("subject", "s", "s", 3)


# --------------------------------------------------------------------------- random interleavings
@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[Request], list[int]]:
    """Adds of distinct samples, deletes (also of samples never added, or naming another subject)
    and delete_subjects, with random event times (ties included) and a random arrival order,
    cut into random batches."""
    subjects = ["s0", "s1", "s2"]
    n_adds = draw(st.integers(1, 10))
    reqs: list[Request] = []
    owner: dict[str, str] = {}
    for i in range(n_adds):
        subj = draw(st.sampled_from(subjects))
        owner[f"x{i}"] = subj
        values = tuple(float(v) for v in draw(st.lists(st.integers(-4, 4), min_size=3, max_size=3)
                                              .filter(lambda v: any(v))))
        reqs.append(add_req(f"a{i}", f"x{i}", subj, BASE + draw(st.integers(0, 12)), values,
                            draw(st.integers(0, 2))))
    for j in range(draw(st.integers(0, 8))):
        t = BASE + draw(st.integers(0, 12))
        if draw(st.booleans()):
            sample = f"x{draw(st.integers(0, n_adds + 1))}"
            subj = owner.get(sample, "s0") if draw(st.integers(0, 4)) else draw(st.sampled_from(subjects))
            reqs.append(Request(f"d{j}", "delete", "h", "eraser", subj, sample, ts=t))
        else:
            reqs.append(Request(f"d{j}", "delete_subject", "h", "eraser", draw(st.sampled_from(subjects)), ts=t))
    order = draw(st.permutations(range(len(reqs))))
    return [reqs[i] for i in order], draw(st.lists(st.integers(1, 4), min_size=len(reqs), max_size=len(reqs)))


def retained_reference(reqs: list[Request]) -> set[str]:
    """The adds without a later-or-equal tombstone of their (head, sample) and subject, or of their
    (head, subject): remove wins in event time, whatever the arrival order."""
    deletes = [r for r in reqs if r.op != "add"]
    out = set()
    for a in reqs:
        if a.op != "add":
            continue
        assert a.ts is not None
        if not any(d.subject_id == a.subject_id and (d.op == "delete_subject" or d.sample_id == a.sample_id)
                   and d.ts is not None and d.ts >= a.ts for d in deletes):
            out.add(str(a.sample_id))
    return out


def ref_row(r: Request) -> np.ndarray:
    assert isinstance(r.input, FeaturesInput)
    return Quantizer(K, 1.0).quantize(l2_normalize(np.asarray(r.input.values, dtype=np.float64)))[0]


@settings(max_examples=150, deadline=None)
@given(scenario=scenarios())
def test_any_interleaving_retains_exactly_the_adds_without_a_later_tombstone(
        tmp_path_factory: pytest.TempPathFactory, scenario: tuple[list[Request], list[int]]) -> None:
    """Requests in any arrival order, in any batches, through the featurizer's core and a real
    sqlite cache: the retained set is exactly the reference's, the deltas summed in order give the
    digest of a from-scratch ledger of that set, and every delete is answered (applied through a
    delta, tombstoned when it removed nothing, or rejected for naming another subject)."""
    reqs, cuts = scenario
    path = tmp_path_factory.mktemp("tomb") / "p0.sqlite"
    ledger = ExactLedger(3, 3, K, 0)
    answered: dict[str, str] = {}
    with FeatureCache(path) as cache:
        at = 0
        offset = 0
        while at < len(reqs):
            chunk = reqs[at: at + cuts[at]]
            msgs = [InMessage(0, offset + i, encode_request(r), r.subject_id.encode()) for i, r in enumerate(chunk)]
            out = featurize_batch(msgs, cache, cfg(), now=NOW)
            for delta in out.deltas:
                for e in delta.entries:
                    assert isinstance(e, RowsEntry)
                    (ledger.add if e.sign > 0 else ledger.delete)(e.q, e.labels)
                    if e.sign < 0:
                        answered.update(dict.fromkeys(e.event_ids, "applied"))
            for rc in out.receipts:
                answered[rc.event_id] = rc.status if rc.status == "tombstoned" else f"rejected:{rc.reason}"
            for dl in out.deadletters:
                assert dl.reason in ("deleted_before_arrival", "duplicate_add", "subject_mismatch"), dl.reason
            cache.commit_batch(out.mutations, [], out.last_offset)
            offset += len(chunk)
            at += len(chunk)
        kept = {s.sample_id: s for s in cache.samples("h")}
    want = retained_reference(reqs)
    assert set(kept) == want
    adds = {str(r.sample_id): r for r in reqs if r.op == "add"}
    scratch = ExactLedger(3, 3, K, 0)
    if want:
        scratch.add(np.stack([ref_row(adds[s]) for s in sorted(want)]), [adds[s].label for s in sorted(want)])
    assert ledger.digest() == scratch.digest()
    for r in reqs:
        if r.op != "add":
            assert answered.get(r.event_id) in ("applied", "tombstoned", "rejected:subject_mismatch"), r


def test_a_tombstone_survives_a_restart_and_refuses_the_late_add(tmp_path: Path) -> None:
    """Durability through the local file (the changelog path is in test_changelog_restore.py and the
    real-broker tests): the delete's tombstone outlives the process that judged it."""
    path = tmp_path / "p0.sqlite"
    delete = Request("d", "delete", "h", "eraser", "s", "x", ts=BASE + 5)
    with FeatureCache(path) as cache:
        out = featurize_batch([InMessage(0, 0, encode_request(delete))], cache, cfg(), now=NOW)
        (receipt,) = out.receipts
        assert (receipt.status, receipt.sample_ids, receipt.tombstone_ts) == ("tombstoned", ("x",), BASE + 5)
        assert receipt.tombstone_expires == BASE + 5 + cfg().tombstones.retention and not receipt.removed
        cache.commit_batch(out.mutations, [], out.last_offset)
    with FeatureCache(path) as cache:
        late = featurize_batch([InMessage(0, 1, encode_request(add_req("a", "x", "s", BASE + 5)))], cache, cfg(),
                               now=NOW)
        assert late.reasons() == {"deleted_before_arrival": 1} and late.deltas == []
        readd = featurize_batch([InMessage(0, 1, encode_request(add_req("a2", "x", "s", BASE + 5.000001)))], cache,
                                cfg(), now=NOW)
        assert readd.reasons() == {} and [e.sample_ids for e in readd.deltas[0].entries] == [("x",)]


def test_expired_tombstones_are_dropped_batch_by_batch(tmp_path: Path) -> None:
    policy = FeaturizerSettings(max_clock_skew_seconds=10, tombstone_retention_seconds=100)
    with FeatureCache(tmp_path / "p0.sqlite") as cache:
        out = featurize_batch([InMessage(0, 0, encode_request(Request("d", "delete", "h", "e", "s", "x", ts=BASE)))],
                              cache, cfg(featurizer=policy), now=BASE + 1)
        cache.commit_batch(out.mutations, [], out.last_offset)
        assert len(cache.all_tombstones()) == 1
        # 101 s later the tombstone is past the retention: the next batch drops it (and its
        # changelog record becomes a tombstone), and an add that old is refused as too old
        old = featurize_batch([InMessage(0, 1, encode_request(add_req("a", "x", "s", BASE)))], cache,
                              cfg(featurizer=policy), now=BASE + 101)
        assert old.reasons() == {"event_too_old": 1}
        assert [k[2] for k in old.mutations.drop_tombstones] == ["x"]
        cache.commit_batch(old.mutations, [], old.last_offset)
        assert cache.all_tombstones() == []


def test_settings_bound_the_clocks(monkeypatch: pytest.MonkeyPatch) -> None:
    from unlearn.infra.settings import Settings

    monkeypatch.setenv("UNLEARN_TOMBSTONE_RETENTION_SECONDS", "86400")
    monkeypatch.setenv("UNLEARN_MAX_CLOCK_SKEW_SECONDS", "60")
    s = Settings.from_env()
    assert CoreConfig.from_settings(s).tombstones == TombstonePolicy(60.0, 86_400.0)
    forever = Settings.from_env(tombstone_retention_seconds=0)
    assert FeaturizerSettings.of(forever).tombstone_retention_seconds == 0  # for ever
    for bad in ({"tombstone_retention_seconds": 30}, {"tombstone_retention_seconds": -1},
                {"max_clock_skew_seconds": -1}, {"tombstone_retention_seconds": float("inf")}):
        with pytest.raises(ValueError):
            Settings.from_env(**bad)
