"""The delete lane: a batch's deletes are judged, committed and delivered ahead of the records
before them in its partition (:func:`split_lane`), pure. docs/featurizer.md, "The delete lane".

Why: under a flow of adds a delete waited for every add ahead of it in its batch to be judged,
sealed and written (issue 29: ~0.35-0.65 ms each). Judging a delete first changes no final state:
remove wins in event time, so the head holds exactly the adds without a later-or-equal tombstone
in any arrival order (``tombstones.py``). It could change what a request is told: an add ahead
of its own delete in the batch would be refused (``deleted_before_arrival``) instead of added,
then removed; a delete judged before a ``delete_subject`` of its subject would remove the sample
the other would have; of two requests sharing an event id, or (signed mode) of one client's
requests near its rate limit, another one would be refused. A delete is judged against its head,
its sample, its subject, its event id, (signed mode) its client's state, and what the cache ties
to them (``held``): the subject its sample was added by (a delete that names another is refused),
and the samples a delete_subject's subject holds (an add ahead of it reusing one of their ids is
refused as a duplicate while the sample is held, and added once it is gone). So it takes the lane
only when its head is already in the cache and no record ahead of it names any of those. Ids are
plain characters
(``schemas/envelope.ID_CHARS``), so a record's JSON strings hold every id it names, and a record
whose strings cannot be read without parsing it (a backslash) may name anything: no delete passes
it. A record that holds an id's string in another field keeps the delete in place too, which
costs only the wait.

What keeps it exact (``batch.BatchProcessor``): the lane's commit leaves the partition's position
where it was and records the lane's offsets as done *ahead* of it (``FeatureCache.commit_batch``,
the changelog's ``Position.ahead``), so after a crash the records before them are judged again and
the lane's are not; the router's copies are admitted over the whole batch in offset order before
the split (``routing.admit_routed``), and only the rest's commit moves the origins; the lane's
deltas name a source stream of their own (:data:`LANE_SUFFIX`), whose offsets grow in the order
they are committed, so the ledger's per-source dedup stays exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from unlearn.schemas.envelope import Request, parse_request
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.schemas.source_id import LANE_SUFFIX
from unlearn.streams.featurizer.batch_io import InMessage
from unlearn.streams.featurizer.routing import might_delete

__all__ = ["LANE_SUFFIX", "Held", "lane_delete", "overtaking", "split_lane"]


_DELETES = frozenset({"delete", "delete_subject"})


def lane_delete(m: InMessage) -> Request | None:
    """The request of a record that is a valid delete or delete_subject, else None (its bytes hint
    it first, so an add is never parsed here). An invalid record keeps its place: its dead letter
    is the rest's."""
    if not might_delete(m.value):
        return None
    try:
        req = parse_request(m.value)  # type: ignore[arg-type]
    except InvalidRequest:
        return None
    return req if req.op in _DELETES else None


def _strings(value: bytes | None, into: set[bytes]) -> bool:
    """Add the JSON strings of a record's bytes to ``into``; False when they cannot be read that way
    (a backslash: a string may hold an escaped id, so the record may name anything). Without a
    backslash every ``"`` delimits a string, so they are the odd pieces of a split (as in
    ``schemas/json_keys.py``): one pass over the bytes, then a set lookup per id."""
    if value is None:
        return True
    if b"\\" in value:
        return False
    into.update(value.split(b'"')[1::2])
    return True


#: The ids the cache ties to a delete (its sample's subject; a delete_subject's samples).
Held = Callable[[Request], Iterable[str]]


def _none_held(r: Request) -> list[str]:
    return []


def split_lane(msgs: Sequence[InMessage], known_head: Callable[[str], bool],
               signed: bool = False, since: int = 0,
               held: Held = _none_held) -> tuple[list[InMessage], list[InMessage]]:
    """(the lane, the rest), each in offset order: the lane holds the deletes of a ``known_head``
    (one already in the cache) that have at least one other record before them in ``msgs`` (one
    partition's records to judge, ascending) and none that names their sample, subject, event id,
    ``held`` ids or, when ``signed``, client. No lane when no delete qualifies: the batch is then judged as it
    is, in one commit. Only records from index ``since`` on may take the lane (those before it are
    judged already, :func:`overtaking`)."""
    lane: list[InMessage] = []
    rest: list[InMessage] = []
    named: set[bytes] | None = None  # the strings of the rest, read once the first delete asks
    readable = True
    for i, m in enumerate(msgs):
        req = lane_delete(m) if rest and readable and i >= since else None
        if req is not None and known_head(req.head_id):
            if named is None:
                named = set()
                readable = all([_strings(r.value, named) for r in rest])
            ids = {req.subject_id, req.event_id, req.sample_id, req.client_id if signed else None,
                   *held(req)} - {None}
            if readable and named.isdisjoint(str(i).encode() for i in ids):
                lane.append(m)
                continue
        rest.append(m)
        if named is not None:
            readable = _strings(m.value, named) and readable
    if not lane:
        return [], list(msgs)
    return lane, rest


def overtaking(judged: Sequence[InMessage], fetched: Sequence[InMessage], known_head: Callable[[str], bool],
               signed: bool = False, held: Held = _none_held) -> list[InMessage]:
    """The deletes among ``fetched`` (one partition's records fetched while ``judged``, the records
    ahead of them, were being judged and not yet committed) that may be committed before
    ``judged``: the lane of :func:`split_lane` over both, drawn from ``fetched`` only, so every
    record left behind a lane delete (``judged`` included) was checked against it.

    The lane ends at the first fetched delete it leaves behind: that delete may take a lane of a
    later batch (once ``judged`` is committed, nothing names its sample any more), and the ledger
    skips a lane delta whose source offset is not above the last one it applied
    (``ledger.delta_rules``), so lanes must leave a partition in offset order."""
    lane, _ = split_lane([*judged, *fetched], known_head, signed, since=len(judged), held=held)
    taken = {m.offset for m in lane}
    kept = [m.offset for m in fetched if m.offset not in taken and lane_delete(m) is not None]
    return [m for m in lane if m.offset < kept[0]] if kept else lane
