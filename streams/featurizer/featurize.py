"""The featurizer's decisions on one micro-batch, without I/O: :func:`featurize_batch`.

In: the records of ONE partition of the by-head topic (ascending offsets; each carries a request
and the place in ``requests`` it was routed from), a read-only view of that partition's feature
cache, the last origin offset judged per requests partition, and an encoder (the frozen
backbones). Out: a :class:`~streams.featurizer.batch_io.BatchOutcome`: one exact delta per head
touched, dead letters (reason codes: ``reasons.py``) and receipts, the cache mutations (the batch's
net effect), the last input offset covered and the new last origin offsets; ``batch.py`` applies it
through the cache's transactional outbox (docs/featurizer.md, "Crash consistency"). The steps:

1. check the batch: one partition, ascending offsets (:func:`check_batch`);
2. drop the router's re-forwarded copies, exactly (``routing.admit_routed``);
3. parse every record (:func:`parse_batch`: an invalid one keeps its turn) and open the inputs
   sealed for transit (``transit_open.open_sealed``);
4. read the trace contexts (:func:`trace_contexts`) and, in signed mode, screen the signatures
   (``auth.Authorizer.screen``);
5. encode the adds, one call per backbone (``add_encoding.encode_adds``);
6. judge every request in offset order against the batch's view of the cache
   (``cache_view.BatchView``, ``judge.judge_batch``): refusals become dead letters and receipts;
7. expire tombstones and event-id marks past the retention;
8. assemble one delta per head touched (``delta_assembly.assemble_deltas``) and the auto
   contracts of the heads the batch created (``head_contracts.auto_contracts``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from unlearn.infra import tracing
from unlearn.schemas.envelope import Request, parse_request
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.schemas.source_id import format_source_id
from unlearn.streams.featurizer.add_encoding import Encoder, RegistryEncoder, encode_adds
from unlearn.streams.featurizer.auth import Authorizer
from unlearn.streams.featurizer.batch_io import BatchOutcome, InMessage
from unlearn.streams.featurizer.cache_view import BatchView, CacheMutations, CacheView, named_samples, named_tombstones
from unlearn.streams.featurizer.core_config import CoreConfig
from unlearn.streams.featurizer.delta_assembly import assemble_deltas
from unlearn.streams.featurizer.events import expired_events, named_events
from unlearn.streams.featurizer.head_contracts import auto_contracts
from unlearn.streams.featurizer.judge import judge_batch
from unlearn.streams.featurizer.routing import Admitted, admit_routed
from unlearn.streams.featurizer.tombstones import EXPIRE_PER_BATCH, expired_tombstones, seconds_to_us
from unlearn.streams.featurizer.transit_open import TransitGate, open_sealed

__all__ = [
    "featurize_batch",
    "check_batch",
    "parse_batch",
    "trace_contexts",
]


def featurize_batch(
    messages: Sequence[InMessage],
    cache: CacheView,
    config: CoreConfig,
    encoder: Encoder | None = None,
    *,
    now: float | None = None,
    origins: Mapping[int, int] | None = None,
    auth: Authorizer | None = None,
    transit: TransitGate | None = None,
    admission: Admitted | None = None,
    cover: int | None = None,
    source_suffix: str = "",
) -> BatchOutcome:
    """Judge one micro-batch of ONE by-head partition against ``cache`` (read only);
    ``origins``: the last origin offset judged per requests partition (the cache's); ``auth``:
    signed mode (``streams/featurizer/auth.py``; None: UNLEARN_AUTH_MODE=off); ``transit``: the
    partition's transit keys (``streams/featurizer/erasure.py``; None: a sealed input is refused).
    The delete lane (``delete_lane.py``) passes ``admission`` (the router's copies already dropped
    over the whole batch: ``messages`` are its records, its origins are the outcome's), ``cover``
    (the last offset the outcome covers, when beyond its last message) and ``source_suffix`` (the
    lane's source stream).

    Returns the deltas, dead letters, rejected receipts, cache mutations and new origin offsets;
    raises only for programming errors (messages of several partitions, offsets not ascending)
    or a backbone failure that hits every input of its group (a systemic failure: the worker
    should stop and be restarted rather than dead-letter everything). Steps:
    :func:`check_batch`, :func:`admit_routed`, :func:`parse_batch`, :func:`encode_adds`,
    :func:`judge_batch`, :func:`assemble_deltas`. A batch of copies only decides nothing but its
    last offset."""
    partition = check_batch(messages)
    last = messages[-1].offset if cover is None else max(messages[-1].offset, cover)
    admitted = admit_routed(messages, origins or {}) if admission is None else admission
    fresh = admitted.messages
    if not fresh:
        # the origins still move: a lane's records judged ahead are admitted here, and the copy rule
        # must know them when the records forwarded after them come
        return BatchOutcome(partition, last, [], [], [], CacheMutations(), origin_offsets=admitted.origin_offsets,
                            reforwarded=admitted.reforwarded, gaps=admitted.gaps)
    ts = time.time() if now is None else float(now)
    reqs = open_sealed(parse_batch(fresh), transit, config.featurizer.require_sealed_input)
    traces = trace_contexts(fresh, reqs)
    screened = auth.screen(fresh, reqs, ts) if auth is not None else None
    encoded = encode_adds(screened.admitted(reqs) if screened else reqs, config, encoder or RegistryEncoder("auto"))
    view = BatchView(cache, named_samples(reqs), named_tombstones(reqs),  # one cache lookup per batch, not per event
                     named_events(reqs))
    judged = judge_batch(fresh, reqs, encoded, view, config, ts, screened)
    judged.overlay.expired = expired_tombstones(cache, config.tombstones, ts)
    judged.overlay.expired_events = expired_events(cache, config.tombstones.horizon_us(seconds_to_us(ts)),
                                                   EXPIRE_PER_BATCH)
    source = format_source_id(partition, last, config.stream + source_suffix)
    deltas, n_rows = assemble_deltas(judged.rows, judged.overlay, source, config)
    return BatchOutcome(partition, last, deltas, judged.deadletters, judged.receipts, judged.overlay.mutations(),
                        accepted=judged.accepted, rows=n_rows, origin_offsets=admitted.origin_offsets,
                        reforwarded=admitted.reforwarded, gaps=admitted.gaps,
                        contracts=auto_contracts(judged.overlay.heads.values(), config), traces=traces)


def check_batch(messages: Sequence[InMessage]) -> int:
    """The batch's partition. Raises ValueError unless the batch is non-empty, of one partition and
    in ascending offsets: events are judged in offset order, and the outcome's last offset (the
    delta's source id) must cover every message."""
    if not messages:
        raise ValueError("featurize_batch needs at least one message")
    partition = messages[0].partition
    prev = -1
    for m in messages:
        if m.partition != partition:
            raise ValueError(f"one partition per batch: got {partition} and {m.partition}")
        if m.offset <= prev:
            raise ValueError(f"offsets must ascend: {m.offset} after {prev}")
        prev = m.offset
    return partition


def parse_batch(messages: Sequence[InMessage]) -> list[Request | InvalidRequest]:
    """Each message's request, or the :class:`InvalidRequest` saying why it is none (kept in place:
    an invalid message still takes its turn, and its offset, in the batch)."""
    reqs: list[Request | InvalidRequest] = []
    for m in messages:
        try:
            reqs.append(parse_request(m.value))  # type: ignore[arg-type]
        except InvalidRequest as exc:
            reqs.append(exc)
    return reqs


def trace_contexts(messages: Sequence[InMessage], reqs: Sequence[Request | InvalidRequest]) -> dict[str, bytes]:
    """event id -> the valid ``traceparent`` header of its record (infra/tracing.py; an invalid one
    is ignored). Only header bytes are looked at: no span here."""
    out: dict[str, bytes] = {}
    for m, r in zip(messages, reqs, strict=True):
        if m.headers:
            tp = tracing.traceparent_of(m.headers)
            if tp is not None and isinstance(r, Request):
                out.setdefault(r.event_id, tp)
    return out
