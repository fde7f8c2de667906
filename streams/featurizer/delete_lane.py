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
its sample, its subject, its event id and (signed mode) its client's state, and nothing else; so
it takes the lane only when its head is already in the cache and no record ahead of it names its
sample, subject, event id or (signed mode) client. Ids are plain characters
(``schemas/envelope.ID_CHARS``): a search of the records' bytes for each quoted id finds every
record that names it (and sometimes one that holds the string in another field: then the delete
just keeps its place).

What keeps it exact (``batch.BatchProcessor``): the lane's commit leaves the partition's position
where it was and records the lane's offsets as done *ahead* of it (``FeatureCache.commit_batch``,
the changelog's ``Position.ahead``), so after a crash the records before them are judged again and
the lane's are not; the router's copies are admitted over the whole batch in offset order before
the split (``routing.admit_routed``), and only the rest's commit moves the origins; the lane's
deltas name a source stream of their own (:data:`LANE_SUFFIX`), whose offsets grow in the order
they are committed, so the ledger's per-source dedup stays exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from unlearn.schemas.envelope import Request, parse_request
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.streams.featurizer.batch_io import InMessage
from unlearn.streams.featurizer.routing import might_delete

__all__ = ["LANE_SUFFIX", "lane_delete", "split_lane"]

#: Appended to the source stream of the lane's deltas (``schemas/source_id.py``):
#: ``"requests#deletes/<partition>@<offset>"``.
LANE_SUFFIX = "#deletes"

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


def _named_ahead(req: Request, ahead: Sequence[InMessage], signed: bool) -> bool:
    """Whether a record of ``ahead`` may name what judging ``req`` depends on (module docstring)."""
    ids = [req.subject_id, req.event_id, *([req.sample_id] if req.sample_id is not None else []),
           *([req.client_id] if signed else [])]
    needles = [b'"' + str(i).encode() + b'"' for i in ids]
    return any(m.value is not None and any(n in m.value for n in needles) for m in ahead)


def split_lane(msgs: Sequence[InMessage], known_head: Callable[[str], bool],
               signed: bool = False) -> tuple[list[InMessage], list[InMessage]]:
    """(the lane, the rest), each in offset order: the lane holds the deletes of a ``known_head``
    (one already in the cache) that have at least one other record before them in ``msgs`` (one
    partition's records to judge, ascending) and none that names their sample, subject, event id
    or, when ``signed``, client. No lane when no delete qualifies: the batch is then judged as it
    is, in one commit."""
    lane: list[InMessage] = []
    rest: list[InMessage] = []
    for m in msgs:
        req = lane_delete(m) if rest else None
        takes_lane = req is not None and known_head(req.head_id) and not _named_ahead(req, rest, signed)
        (lane if takes_lane else rest).append(m)
    if not lane:
        return [], list(msgs)
    return lane, rest
