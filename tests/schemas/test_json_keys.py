"""Duplicated JSON keys (``schemas/json_keys.py``): what orjson writes never has one; a key written
twice, plainly or with escapes, at any depth, is found; a key's name inside a value is not one."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.schemas.envelope import parse_request
from unlearn.schemas.json_keys import duplicate_key
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.schemas.request_inputs import parse_inner_input

json_values = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                       max_size=4), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(obj=st.dictionaries(st.text(max_size=6), json_values, max_size=6))
def test_what_a_serializer_writes_has_no_duplicate(obj: dict) -> None:
    raw = orjson.dumps(obj)
    assert duplicate_key(raw, orjson.loads(raw)) is None


@settings(max_examples=200, deadline=None)
@given(obj=st.dictionaries(st.text(min_size=1, max_size=6), json_values, min_size=1, max_size=6), data=st.data())
def test_a_key_written_twice_is_found_however_escaped(obj: dict, data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(sorted(obj)))
    escaped = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else c for c in key)
    name = data.draw(st.sampled_from([orjson.dumps(key).decode(), f'"{escaped}"']))
    raw = orjson.dumps(obj)[:-1] + f', {name}: 1}}'.encode()
    assert duplicate_key(raw, orjson.loads(raw)) == key


def test_requests_with_a_repeated_key_are_refused() -> None:
    base = {"schema": "unlearn.request/v1", "event_id": "e", "op": "add", "head_id": "h", "client_id": "c",
            "subject_id": "head_id", "sample_id": "x", "label": 0, "input": {"kind": "text", "text": "t"}}
    ok = orjson.dumps(base)
    assert parse_request(ok).subject_id == "head_id"  # a key's name as a value is no duplicate
    for raw in (ok[:-1] + b',"head_id":"other"}', ok[:-1] + b',"head\\u005fid":"other"}',
                ok.replace(b'"text":"t"', b'"text":"t","text":"u"')):
        with pytest.raises(InvalidRequest) as info:
            parse_request(raw)
        assert info.value.reason == "duplicate_key"
    with pytest.raises(InvalidRequest) as info:
        parse_inner_input(b'{"kind": "text", "text": "a", "text": "b"}')
    assert info.value.reason == "duplicate_key"


def _reference(raw: bytes, parsed: object) -> str | None:
    """``duplicate_key`` as it was before the one-split test (a count of ``"key"`` per key)."""
    import json

    from unlearn.schemas import json_keys

    if b"\\" not in raw and all(raw.count(b'"' + k.encode() + b'"') == 1 for k in json_keys._keys(parsed)):
        return None
    try:
        json.loads(raw, object_pairs_hook=json_keys._unique)
    except json_keys._Duplicate as dup:
        return dup.key
    except ValueError:
        return None
    return None


_names = st.sampled_from(["a", "b", "ab", "head_id", ":", ",", " ", "", "é", "a b"])


@settings(max_examples=400, deadline=None)
@given(obj=st.dictionaries(_names, st.recursive(
    st.none() | st.integers(-5, 5) | _names,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_names, inner, max_size=3), max_leaves=8),
    max_size=5), data=st.data())
def test_the_one_split_test_answers_as_the_count_per_key(obj: dict, data: st.DataObject) -> None:
    """Values repeating keys' names and each other, keys repeated at any depth (spliced in), plain
    or escaped: the same answer as the reference (a count of ``"key"`` per key)."""
    raw = orjson.dumps(obj)
    if obj and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(obj)))
        name = data.draw(st.sampled_from([orjson.dumps(key).decode(), '"' + "".join(
            f"\\u{ord(c):04x}" for c in key) + '"']))
        value = data.draw(st.sampled_from(["1", "{}", "[]", orjson.dumps(key).decode()]))
        raw = raw[:-1] + f", {name}: {value}}}".encode()
    parsed = orjson.loads(raw)
    assert duplicate_key(raw, parsed) == _reference(raw, parsed)
