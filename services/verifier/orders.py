"""Other orders and partitionings of the accepted units, which must give the log-order digest.

The only order constraint an exact ledger has is that a delete must not run before the add it
removes (the non-member check would refuse it), so the units form a dependency DAG: each delete
unit depends on the latest earlier add unit of each of its sample ids. A shuffled order is a
random linear extension of that DAG; a partitioning deals groups of units linked by a sample id
(as keying keeps them together) to 2..8 ledgers that are then merged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from unlearn.ledger import ExactLedger, MultisetHash

from .errors import VerifyError
from .replay import UNIT_CLASS_ROW, UNIT_PACKED, UNIT_VECTOR_ROW, Units


class Dependencies(NamedTuple):
    """The add-before-delete DAG of the units."""

    children: list[list[int]]  # unit -> the delete units that depend on it
    indegree: list[int]
    unmatched: list[int]  # delete units with no earlier add of one of their sample ids


def dependencies(units: Units) -> Dependencies:
    """A delete unit depends on the latest earlier add unit of each of its sample ids (matched one
    to one, in log order); a delete with no such add is unmatched (a ghost delete)."""
    n = len(units)
    children: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    stacks: dict[str, list[int]] = {}
    unmatched: list[int] = []
    for u in range(n):
        if units.sign[u] > 0:
            for s in units.samples[u]:
                stacks.setdefault(s, []).append(u)
        else:
            ok = True
            parents: set[int] = set()
            for s in units.samples[u]:
                st = stacks.get(s)
                if st:
                    parents.add(st.pop())
                else:
                    ok = False
            for p in parents:
                children[p].append(u)
                indeg[u] += 1
            if not ok:
                unmatched.append(u)
    return Dependencies(children, indeg, unmatched)


def components(units: Units) -> list[list[int]]:
    """Units linked by a shared sample id (union-find): keyed partitioning keeps them together."""
    parent = list(range(len(units)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first: dict[str, int] = {}
    for u, samples in enumerate(units.samples):
        for s in samples:
            if s in first:
                a, b = find(first[s]), find(u)
                if a != b:
                    parent[b] = a
            else:
                first[s] = u
    groups: dict[int, list[int]] = {}
    for u in range(len(units)):
        groups.setdefault(find(u), []).append(u)
    return list(groups.values())


def _random_extension(members: Sequence[int], children: list[list[int]], rng: np.random.Generator) -> list[int]:
    """A uniformly random pick among ready units at each step (Kahn): a random order in which
    every unit follows its dependencies (all within ``members``)."""
    member = set(members)
    deg = dict.fromkeys(members, 0)
    for u in members:
        for ch in children[u]:
            if ch in member:
                deg[ch] += 1
    ready = [u for u in members if deg[u] == 0]
    order: list[int] = []
    while ready:
        j = int(rng.integers(len(ready)))
        u = ready[j]
        ready[j] = ready[-1]
        ready.pop()
        order.append(u)
        for ch in children[u]:
            if ch in member:
                deg[ch] -= 1
                if deg[ch] == 0:
                    ready.append(ch)
    if len(order) != len(members):  # pragma: no cover - the graph is a DAG by construction
        raise VerifyError("dependency cycle in the replay units")
    return order


def apply_units(ledger: ExactLedger, units: Units, chunk: Sequence[int], sign: int) -> None:
    """Apply ``chunk`` with one sign as few GEMMs: class rows together, vector rows by label width,
    packed units one by one."""
    rows_c = [units.ref[u] for u in chunk if units.kind[u] == UNIT_CLASS_ROW]
    rows_v = [units.ref[u] for u in chunk if units.kind[u] == UNIT_VECTOR_ROW]
    op = ledger.add if sign > 0 else ledger.delete
    if rows_c:
        idx = np.asarray(rows_c, dtype=np.int64)
        op(units.Q[idx], np.asarray([units.class_labels[i] for i in rows_c], dtype=np.int64))
    if rows_v:
        by_width: dict[int, list[int]] = {}
        for i in rows_v:
            by_width.setdefault(units.vector_labels[i].shape[0], []).append(i)
        for _, rows in sorted(by_width.items()):
            op(units.Q[np.asarray(rows, dtype=np.int64)], np.stack([units.vector_labels[i] for i in rows]))
    for u in chunk:
        if units.kind[u] == UNIT_PACKED:
            ledger.absorb(units.packed[units.ref[u]], sign)


def _apply_order(ledger: ExactLedger, units: Units, order: Sequence[int], rng: np.random.Generator) -> int:
    """Apply units in ``order``, in random-size batches (each: its adds, then its deletes -- still
    a valid order, since a batch's deletes follow their adds). Returns the number of batches."""
    n = len(order)
    mean = max(1, n // 12)
    i = 0
    batches = 0
    while i < n:
        size = int(rng.integers(1, 2 * mean + 1))
        chunk = order[i:i + size]
        i += size
        batches += 1
        apply_units(ledger, units, [u for u in chunk if units.sign[u] > 0], +1)
        apply_units(ledger, units, [u for u in chunk if units.sign[u] < 0], -1)
    return batches


def _segments(n: int, unmatched: Sequence[int]) -> list[tuple[list[int], int | None]]:
    """Log-order segments separated by unmatched deletes (which keep their log position)."""
    out: list[tuple[list[int], int | None]] = []
    start = 0
    for u in sorted(unmatched):
        out.append((list(range(start, u)), u))
        start = u + 1
    out.append((list(range(start, n)), None))
    return out


def shuffled_digest(units: Units, rng: np.random.Generator, deps: Dependencies
                    ) -> tuple[str, ExactLedger, dict[str, Any]]:
    """The digest of one random valid order of the units (unmatched deletes stay in place)."""
    led = ExactLedger(units.d, units.c, units.k, units.k_y)
    batches = 0
    for members, barrier in _segments(len(units), deps.unmatched):
        order = _random_extension(members, deps.children, rng)
        if barrier is not None:
            order.append(barrier)
        batches += _apply_order(led, units, order, rng)
    return led.digest(), led, {"batches": batches}


def partitioned_digest(units: Units, rng: np.random.Generator, deps: Dependencies,
                       comps: list[list[int]]) -> tuple[str, dict[str, Any]]:
    """The digest of one random partitioning: sample groups dealt to 2..8 ledgers, each built in
    a random order, merged in a random order."""
    n_parts = int(rng.integers(2, min(8, len(comps)) + 1)) if len(comps) >= 2 else 1
    assign = rng.integers(0, n_parts, size=len(comps))
    parts: list[list[int]] = [[] for _ in range(n_parts)]
    for comp, p in zip(comps, assign, strict=True):
        parts[int(p)].extend(comp)
    ledgers = []
    for members in parts:
        led = ExactLedger(units.d, units.c, units.k, units.k_y)
        _apply_order(led, units, _random_extension(sorted(members), deps.children, rng), rng)
        ledgers.append(led)
    merged = ExactLedger(units.d, units.c, units.k, units.k_y)
    for j in rng.permutation(n_parts):
        merged = merged.merge(ledgers[int(j)])
    return merged.digest(), {"partitions": n_parts, "sizes": [len(p) for p in parts]}


def retained_rows(units: Units, deps: Dependencies) -> list[int] | None:
    """Row units of the retained multiset (adds no delete removed); None when not derivable
    (packed entries carry no rows; unmatched deletes remove rows nobody added)."""
    if units.has_packed or deps.unmatched:
        return None
    return [u for u in range(len(units)) if units.sign[u] > 0 and not deps.children[u]]


def retained_multiset(units: Units, rows: Sequence[int]) -> MultisetHash:
    """The multiset hash of the retained row units ``rows``, from scratch (docs/design.md section 6)."""
    h = MultisetHash(units.d, units.k, units.k_y)
    cls = [units.ref[u] for u in rows if units.kind[u] == UNIT_CLASS_ROW]
    if cls:
        h.add(units.Q[np.asarray(cls, dtype=np.int64)], np.asarray([units.class_labels[i] for i in cls], np.int64))
    for u in rows:  # target vectors may differ in width: one row at a time
        if units.kind[u] == UNIT_VECTOR_ROW:
            h.add(units.Q[units.ref[u]], units.vector_labels[units.ref[u]][None, :])
    return h
