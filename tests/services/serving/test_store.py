"""The store's rules: only superseding updates are served, exact supersedes fast at one version,
and the posterior of the last exact head carries variance across fast updates."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tests.services.serving.support import D, make_head
from unlearn.ledger.bayes import predictive_variance
from unlearn.services.serving.predict import HeadStore, predict


def test_store_accepts_only_newer_versions_and_exact_supersedes_fast() -> None:
    store = HeadStore()
    f1, e1 = make_head(1, "fast", 1), make_head(1, "exact", 2)
    f2, e2 = make_head(2, "fast", 3), make_head(2, "exact", 4)
    assert store.offer(f1) == "accepted" and store.get("h").posterior is None
    assert store.offer(e1) == "accepted" and store.get("h").posterior_source == "current_head"
    assert store.offer(make_head(1, "fast", 9)) == "stale"  # fast never replaces exact of the same version
    assert store.offer(make_head(1, "exact", 9)) == "stale"  # same (version, mode): first one stays
    assert store.get("h").update is e1
    assert store.offer(f2) == "accepted"
    sh = store.get("h")
    # no posterior on the fast head: the last exact one (version 1) is used, and said so
    assert sh.update is f2 and sh.posterior is e1.posterior and sh.posterior_version == 1
    assert sh.posterior_source == "last_exact_head"
    X = np.random.default_rng(0).normal(size=(4, D)) / 3
    out = predict(sh, X, sigma2=2.0)
    assert out["version"] == 2 and out["mode"] == "fast" and out["digest"] == f2.digest
    assert out["variance"]["source"] == "last_exact_head" and out["variance"]["posterior_version"] == 1
    assert "version 1" in out["variance"]["note"]
    want = predictive_variance(X, e1.posterior, 2.0)
    assert [p["variance"] for p in out["predictions"]] == want.tolist()
    assert [p["scores"] for p in out["predictions"]] == (X @ f2.weights).tolist()
    assert [p["predicted_class"] for p in out["predictions"]] == np.argmax(X @ f2.weights, axis=1).tolist()
    assert store.offer(e1) == "stale"
    assert store.offer(e2) == "accepted" and store.get("h").posterior_version == 2
    # a head that never carried a posterior: variance unavailable, explained
    store.offer(make_head(1, "fast", 5, head="g"))
    out = predict(store.get("g"), X)
    assert out["variance"]["available"] is False and all(p["variance"] is None for p in out["predictions"])


def test_store_order_is_head_update_supersedes() -> None:
    """The store has no ordering of its own: it accepts exactly what ``HeadUpdate.supersedes`` says."""
    updates = [make_head(v, m, seed=10 * v + (m == "exact")) for v in (1, 2, 3) for m in ("fast", "exact")]
    for cur in updates:
        for new in updates:
            store = HeadStore()
            store.offer(cur)
            assert (store.offer(new) == "accepted") == new.supersedes(cur)


def test_a_fast_head_without_a_digest_is_served_with_a_null_digest() -> None:
    """Fast head updates carry no ledger digest (it is computed at resets): serving shows null and
    still names the digest of the exact head whose posterior gives the variance."""
    store = HeadStore()
    e1 = make_head(1, "exact", 1)
    bare = replace(make_head(2, "fast", 2), digest=None)
    assert store.offer(e1) == "accepted" and store.offer(bare) == "accepted"
    sh = store.get("h")
    assert sh is not None and sh.summary()["digest"] is None
    out = predict(sh, np.zeros((1, D)))
    assert out["digest"] is None and out["mode"] == "fast"
    assert out["variance"]["posterior_digest"] == e1.digest and out["variance"]["posterior_version"] == 1


def test_posterior_of_another_dimension_is_not_carried_over() -> None:
    store = HeadStore()
    store.offer(make_head(1, "exact", 1))
    assert store.offer(make_head(2, "fast", 2, d=D + 1)) == "accepted"
    sh = store.get("h")
    assert sh.posterior is None and sh.posterior_source is None and sh.posterior_version is None


def test_summary_and_snapshot() -> None:
    store = HeadStore()
    u = make_head(3, "exact", 1)
    store.offer(u, now=u.created_ts + 2.0)
    assert len(store) == 1 and list(store.all()) == ["h"]
    s = store.get("h").summary(now=u.created_ts + 5.0)
    assert (s["head_id"], s["version"], s["mode"], s["d"], s["c"]) == ("h", 3, "exact", D, 3)
    assert s["age_seconds"] == 5.0 and s["received_age_seconds"] == 3.0
    assert s["has_posterior"] and s["posterior_version"] == 3 and s["offsets"] == [[0, 3]]
    snap = store.all()
    store.offer(make_head(4, "exact", 2))
    assert snap["h"].update is u  # a snapshot is a copy: later swaps do not show through
