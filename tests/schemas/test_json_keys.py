"""Duplicated JSON keys (``schemas/json_keys.py``): what orjson writes never has one; a key written
twice, plainly or with escapes, at any depth, is found; a key's name inside a value is not one."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unlearn.schemas.envelope import InvalidRequest, parse_inner_input, parse_request
from unlearn.schemas.json_keys import duplicate_key

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
