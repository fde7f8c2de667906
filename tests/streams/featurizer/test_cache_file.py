"""The feature cache's sqlite file: its schema version and identity are checked on open."""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

import numpy as np
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


_V1_SAMPLES = """CREATE TABLE samples (head_id TEXT NOT NULL, sample_id TEXT NOT NULL, subject_id TEXT NOT NULL,
    client_id TEXT NOT NULL, event_id TEXT NOT NULL, label_class INTEGER, label_vec BLOB, q BLOB NOT NULL,
    event_us INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (head_id, sample_id)) WITHOUT ROWID"""


def test_a_schema_1_file_is_upgraded_in_place_and_its_int64_rows_still_read(tmp_path: Path) -> None:
    """A cache written before q was stored as int32: its samples table (q as int64 LE blobs, no
    ``q_itemsize``) reads back to the same q; new rows are int32 blobs; the file says schema 2 after."""
    path = tmp_path / "c.sqlite"
    FeatureCache(path).close()
    db = sqlite3.connect(path, isolation_level=None)
    old_q = [2**30, -(2**30), 5]
    db.execute("DROP TABLE samples")
    db.execute(_V1_SAMPLES)
    db.execute("INSERT INTO samples VALUES ('h', 'old', 'u', 'c1', 'add-old', 1, NULL, ?, 0)",
               (struct.pack("<3q", *old_q),))
    db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    db.close()
    for offset in (7, 8):  # the upgrade happens once; reopening an upgraded file changes nothing
        with FeatureCache(path) as cache:
            got = cache.get_sample("h", "old")
            assert got is not None and got.q.dtype == np.int64 and got.q.tolist() == old_q
            new = sample("new", "u", [-(2**30), 2**30, -1])
            cache.commit_batch(CacheMutations(put_heads=(HEAD,), put_samples=(new,)), [], offset)
            back = cache.get_sample("h", "new")
            assert back is not None and back.q.dtype == np.int64 and back.q.tolist() == new.q.tolist()
            rows = dict(cache._db.execute("SELECT sample_id, length(q) FROM samples").fetchall())
            assert rows == {"old": 24, "new": 12}  # 8 and 4 bytes per value
            version = cache._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            assert version == ("2",) == (str(CACHE_SCHEMA_VERSION),)


def test_q_beyond_2_30_is_refused_never_wrapped(tmp_path: Path) -> None:
    with FeatureCache(tmp_path / "c.sqlite") as cache, pytest.raises(CacheError, match=r"2\^30"):
        cache.commit_batch(CacheMutations(put_heads=(HEAD,), put_samples=(sample("a", "s", [1, 2**31 - 1, 3]),)),
                           [], 7)
