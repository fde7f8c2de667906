"""Topic family names without a broker: round trips, what is not a member, and the pattern that
external consumers subscribe with agrees with ``parse``."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unlearn.common.families import heads_family, state_family
from unlearn.runtime.topic_family import TopicFamily

prefixes = st.text(alphabet="abcXYZ019._-", max_size=12)
numbers = st.integers(min_value=0, max_value=10**9)


@given(prefixes, numbers, numbers)
def test_topic_and_parse_round_trip_and_the_pattern_agrees(prefix: str, partition: int, generation: int) -> None:
    fam = heads_family(prefix)
    name = fam.topic(partition, generation)
    assert fam.parse(name) == (partition, generation)
    assert re.fullmatch(fam.pattern.lstrip("^"), name)


@pytest.mark.parametrize("name", [
    "p.heads", "p.heads.p0", "p.heads.p0.g", "p.heads.px.g1", "p.heads.p1.g1.x", "p.heads.p-1.g2",
    "p.heads.p\uff11.g1",  # a non-ASCII digit
    "q.heads.p0.g0", "p.ledger-state.p0.g0", "p.headsXp0.g0",
])
def test_names_outside_the_family_are_not_members(name: str) -> None:
    fam = heads_family("p.")
    assert fam.parse(name) is None and not fam.matches(name)
    assert not re.match(fam.pattern, name)


def test_select_sorts_numerically_and_generations_are_per_partition() -> None:
    fam = TopicFamily("x.", "heads")
    names = ["x.heads.p0.g10", "x.heads.p0.g9", "x.heads.p1.g0", "x.requests", "x.ledger-state.p0.g3"]
    assert fam.select(names) == ["x.heads.p0.g9", "x.heads.p0.g10", "x.heads.p1.g0"]
    assert fam.generations(names, 0) == [9, 10] and fam.generations(names, 2) == []
    assert state_family("x.").generations(names, 0) == [3]
    with pytest.raises(ValueError):
        fam.topic(-1, 0)
