"""The head contract format: strict parsing, the JSON Schema, and growth-only extension."""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
import pytest

from unlearn.schemas import SCHEMA_DIR
from unlearn.schemas.head_contract import ContractError, HeadContract, decode_contract, encode_contract, parse_contract

SCHEMA = jsonschema.Draft202012Validator(orjson.loads((SCHEMA_DIR / "head-contract.v1.schema.json").read_bytes()))


def contract(**changes: Any) -> HeadContract:
    base: dict[str, Any] = dict(head_id="faces", version=1, dimension=4, backbone="features", input_kind="features",
                                normalization="l2", feature_bound=1.0, frac_bits=30, label_frac_bits=0,
                                label_kind="class", gamma=1.0, n_classes=3)
    return HeadContract(**{**base, **changes})


def test_round_trip_and_schema() -> None:
    for c in (contract(), contract(label_names=("a", "b", "c")),
              contract(label_kind="vector", n_classes=0, label_width=5, label_frac_bits=20, origin="auto")):
        doc = orjson.loads(encode_contract(c))
        SCHEMA.validate(doc)
        assert decode_contract(encode_contract(c)) == c
        assert parse_contract(doc) == c


@pytest.mark.parametrize(("change", "message"), [
    ({"schema": "unlearn.head-contract/v2"}, "schema must be"),
    ({"colour": "red"}, "unknown field(s): colour"),
    ({"dimension": "4"}, "dimension must be a int"),
    ({"dimension": True}, "dimension must be a int"),
    ({"dimension": 0}, "dimension must be in"),
    ({"n_classes": 0}, "n_classes in 1.."),
    ({"n_classes": 2**20 + 1}, "n_classes in 1.."),
    ({"label_names": ["a", "a", "b"]}, "distinct"),
    ({"label_names": ["a"]}, "1 names for 3 classes"),
    ({"frac_bits": 31}, "frac_bits must be in 1..30"),
    ({"feature_bound": 2.0}, "<= 2^30"),
    ({"gamma": 0}, "gamma must be"),
    ({"head_id": "a b"}, "head_id must be"),
    ({"label_width": 3}, "no label_width"),
    ({"input_kind": "audio"}, "input_kind must be"),
])
def test_strict_parser_names_the_problem(change: dict[str, Any], message: str) -> None:
    doc = {**contract().to_dict(), **change}
    with pytest.raises(ContractError, match=message.replace("(", r"\(").replace(")", r"\)").replace("^", r"\^")):
        parse_contract(doc)
    # two cross-field rules are the parser's alone: len(label_names) == n_classes, bound * 2^k <= 2^30
    assert SCHEMA.is_valid(doc) == (message in ("1 names for 3 classes", "<= 2^30"))


def test_missing_fields_and_bad_json() -> None:
    doc = contract().to_dict()
    del doc["n_classes"]
    with pytest.raises(ContractError, match="missing field: n_classes"):
        parse_contract(doc)
    assert not SCHEMA.is_valid(doc)
    with pytest.raises(ContractError, match="not JSON"):
        decode_contract(b"{")
    with pytest.raises(ContractError, match="JSON object"):
        decode_contract(b"[]")


def test_extend_only_grows_and_bumps_the_version() -> None:
    c = contract()
    c2 = c.extend(5)
    assert (c2.version, c2.n_classes, c2.dimension) == (2, 5, 4)
    for bad in (3, 2, None):
        with pytest.raises(ContractError, match="extend needs more"):
            c.extend(bad)
    with pytest.raises(ContractError, match="unnamed classes"):
        c.extend(names=("d",))
    named = contract(label_names=("a", "b", "c")).extend(names=("d",))
    assert (named.version, named.n_classes, named.label_names) == (2, 4, ("a", "b", "c", "d"))
    with pytest.raises(ContractError, match="distinct"):
        named.extend(names=("a",))
    with pytest.raises(ContractError, match="only a class label space"):
        contract(label_kind="vector", n_classes=0, label_width=2).extend(3)
