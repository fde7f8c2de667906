"""ledger/shared_limbs.py: holders of shared limbs never see each other's writes, whatever the
order of their writes; arrays given up are reused only once nobody else has them, by any holder of
their shape, and one set per shape is kept."""

from __future__ import annotations

import numpy as np

from unlearn.ledger import shared_limbs
from unlearn.ledger.shared_limbs import SharedLimbs


def _limbs(v: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (np.full((3, 3), v, np.int64), np.full((3, 3), v, np.int64), np.full((3, 3), v, np.int64))


def _values(s: SharedLimbs) -> list[int]:
    return [int(limb[0, 0]) for limb in s.limbs]


def test_holders_of_shared_limbs_never_see_each_others_writes() -> None:
    a = SharedLimbs(_limbs(1))
    b = a.share()
    c = b.share()  # a copy of a copy: three holders of the same arrays
    a.combine(np.add, _limbs(10))
    b.combine(np.subtract, _limbs(1))
    a.combine(np.add, _limbs(100))  # its spare (the first arrays) is still c's: not written
    c.combine(np.add, _limbs(5))
    assert (_values(a), _values(b), _values(c)) == ([111] * 3, [0] * 3, [6] * 3)
    assert all(limb.flags.writeable for s in (a, b, c) for limb in s.limbs)


def test_the_arrays_given_up_are_reused_once_nobody_else_holds_them() -> None:
    a = SharedLimbs(_limbs(1))
    first = [id(limb) for limb in a.limbs]
    b = a.share()
    a.combine(np.add, _limbs(1))  # into new arrays: b holds the first ones
    second = [id(limb) for limb in a.limbs]
    assert not set(first) & set(second)
    view = b.limbs[1][0]  # a view keeps its array referred to
    del b
    a.share()  # dropped at once: the arrays are a's alone again, but a cannot know it
    a.combine(np.add, _limbs(1))
    assert not (set(first) | set(second)) & {id(limb) for limb in a.limbs}  # the view holds a first one
    del view
    a.share()
    a.combine(np.add, _limbs(1))
    assert [id(limb) for limb in a.limbs] == second  # given up the time before, held by nobody now
    assert _values(a) == [4] * 3


def test_one_spare_per_shape_serves_every_holder_of_that_shape() -> None:
    shape = (4, 4)

    def ones() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (np.ones(shape, np.int64), np.ones(shape, np.int64), np.ones(shape, np.int64))

    heads = [SharedLimbs((np.zeros(shape, np.int64), np.zeros(shape, np.int64), np.zeros(shape, np.int64)))
             for _ in range(3)]
    copies = [h.share() for h in heads]
    for h in heads:
        h.combine(np.add, ones())  # each gives up the arrays its copy holds
    kept = shared_limbs._SPARES[shape]
    assert [id(a) for a in kept] == [id(a) for a in copies[2].limbs]  # the last set only, not three
    last = [id(a) for a in kept]
    del kept, copies[2]  # now nobody holds that set
    heads[0].share()
    heads[0].combine(np.add, ones())
    assert [id(a) for a in heads[0].limbs] == last  # another head of the shape writes into it
    assert [int(h.limbs[0][0, 0]) for h in heads] == [2, 1, 1]
    assert [int(c.limbs[0][0, 0]) for c in copies] == [0, 0]
