"""The feature cache's sqlite file: its schema version and identity are checked on open."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.streams.featurizer.test_feature_cache import HEAD, sample
from unlearn.streams.featurizer.cache_file import CACHE_SCHEMA_VERSION, CacheError, cache_path
from unlearn.streams.featurizer.cache_view import CacheMutations
from unlearn.streams.featurizer.feature_cache import FeatureCache


def test_a_file_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    with FeatureCache(path) as cache:
        cache.commit_batch(CacheMutations(put_heads=(HEAD,), put_samples=(sample("a", "s", [1, 2, 3]),)), [], 7)
        version = cache._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert version == (str(CACHE_SCHEMA_VERSION),)
        cache._db.execute("UPDATE meta SET value = '0' WHERE key = 'schema_version'")
    with pytest.raises(CacheError, match="schema_version"):
        FeatureCache(path)

def test_identity_is_checked_on_open(tmp_path: Path) -> None:
    FeatureCache.open_partition(tmp_path, "req", 0, {"client_id": "a"}).close()
    FeatureCache.open_partition(tmp_path, "req", 0, {"client_id": "a"}).close()
    with pytest.raises(CacheError):
        FeatureCache.open_partition(tmp_path, "req", 0, {"client_id": "b"})
    # odd stream names become one safe directory
    p = cache_path(tmp_path, "req[site/7 ü]", 1)
    assert p.parent.parent == tmp_path / "featurizer" and p.name == "p1.sqlite"
