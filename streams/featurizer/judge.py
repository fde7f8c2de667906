"""Judging a batch's requests in offset order against the cache plus the batch so far (an
:class:`~streams.featurizer.cache_view.Overlay`). An add is checked against its event id, remove
wins, its head's first-add facts and contract, then quantized and cached; a delete or
delete_subject removes what was cached at or before its event time and leaves its tombstone. Each
refusal becomes a dead letter (and a rejected receipt for a delete). The result, a
:class:`Judgement`, holds the rows per head and the overlay: the cache after the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from unlearn.features.contract import (
    BatchQuantizer,
    FeatureRejected,
    QuantizeRow,
    check_information,
    fixed_dim,
    quantize_feature_row,
    quantize_label,
)
from unlearn.schemas.client_record import ClientRecord
from unlearn.schemas.deadletter import DeadLetter
from unlearn.schemas.envelope import Request
from unlearn.schemas.receipts import Receipt
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.streams.featurizer.add_encoding import EncodedAdds
from unlearn.streams.featurizer.auth import NO_RECEIPT_REASONS, Authorizer, Screened
from unlearn.streams.featurizer.batch_io import InMessage
from unlearn.streams.featurizer.cache_view import CachedSample, CacheView, HeadInfo, Overlay
from unlearn.streams.featurizer.core_config import CoreConfig
from unlearn.streams.featurizer.delta_assembly import HeadRows
from unlearn.streams.featurizer.events import ERASED, EventMark, judge_event
from unlearn.streams.featurizer.head_contracts import AutoContracts, check_contract, judged_contract
from unlearn.streams.featurizer.refusals import refusal, salvage_delete_ids
from unlearn.streams.featurizer.tombstones import (
    TombstonePolicy,
    add_event_time,
    add_keys,
    blocking_tombstone,
    delete_event_time,
    seconds_to_us,
    tombstones_of,
)
from unlearn.streams.featurizer.transit_open import UnopenedRequest

__all__ = [
    "judge_add",
    "judge_delete",
    "judge_delete_subject",
    "judge_remove_wins",
    "Judgement",
    "judge_batch",
    "judge_remove",
]


def judge_add(r: Request, feat: np.ndarray | FeatureRejected | None, backbone_key: str | None, view: CacheView,
              config: CoreConfig, quantize: QuantizeRow = quantize_feature_row, event_us: int = 0,
              contracts: AutoContracts | None = None) -> tuple[CachedSample, HeadInfo, bool]:
    """(sample to cache, dated ``event_us``, its head, whether the head is new) for an add; raises
    :class:`FeatureRejected`.
    A head's backbone, input kind, dimension, label kind and grid are fixed by its first accepted
    add, so every later row of the head is on the same grid and in the same space; the add must
    also fit the head's contract (declared, else auto: :func:`auto_contract`), which
    bounds its label space and gives a new head its grid. ``quantize`` is ``quantize_feature_row``
    or the batch's ``BatchQuantizer`` (the same bits, proven by a property test); ``contracts``: the
    batch's auto contracts (:func:`judged_contract`)."""
    assert r.sample_id is not None and r.input is not None and r.label is not None
    if view.get_sample(r.head_id, r.sample_id) is not None:
        raise FeatureRejected("duplicate_add",
                              f"sample {r.sample_id!r} of head {r.head_id!r} is already in the feature cache")
    if isinstance(feat, FeatureRejected):
        raise feat
    if feat is None or backbone_key is None:
        raise FeatureRejected("undecodable_input", "no features were produced for this input")
    dim = int(feat.shape[0])
    head = view.get_head(r.head_id)
    if head is not None:
        if head.backbone != backbone_key or head.input_kind != r.input.kind:
            raise FeatureRejected("backbone_mismatch",
                           f"head {r.head_id!r} uses {head.backbone!r} on {head.input_kind} inputs; this add "
                           f"resolves to {backbone_key!r} on a {r.input.kind} input")
        if dim != head.dim:
            raise FeatureRejected("dimension_mismatch",
                                  f"head {r.head_id!r} has d={head.dim}, this add has {dim} features")
        k, k_y = head.frac_bits, head.label_frac_bits
    else:
        fixed = fixed_dim(backbone_key)
        if fixed is not None and dim != fixed:
            raise FeatureRejected("dimension_mismatch",
                           f"backbone {backbone_key!r} has d={fixed}, this add has {dim} features")
        max_dim = config.heads.max_feature_dim
        if dim > max_dim:
            raise FeatureRejected("dimension_too_large",
                           f"d={dim} exceeds UNLEARN_MAX_FEATURE_DIM={max_dim} for new head {r.head_id!r}")
        declared = config.contracts.get(r.head_id)  # the contract wins: a new head takes its grid
        k, k_y = (declared.frac_bits, declared.label_frac_bits) if declared else (config.heads.frac_bits,
                                                                                  config.heads.label_frac_bits)
    kind, width, label = quantize_label(r.label, k_y)
    if head is not None and (kind != head.label_kind or width != head.label_width):
        what = "class indices" if head.label_kind == "class" else f"label vectors of width {head.label_width}"
        got = "a class index" if kind == "class" else f"a label vector of width {width}"
        raise FeatureRejected("label_mismatch", f"head {r.head_id!r} takes {what}, got {got}")
    contract = judged_contract(r, head, dim, kind, width, config, contracts)
    check_contract(r, contract, head, backbone_key, dim, kind, width, label)
    q = quantize(feat, k, contract.feature_bound, contract.normalize)
    check_information(feat, q, contract.normalize)
    new_head = head is None
    if head is None:
        head = HeadInfo(r.head_id, backbone_key, r.input.kind, dim, kind, width, k, k_y)
    cs = CachedSample(r.head_id, r.sample_id, r.subject_id, r.client_id, r.event_id, label, q, event_us)
    return cs, head, new_head


def judge_delete(r: Request, view: CacheView, event_us: int | None = None) -> list[CachedSample]:
    """The cached sample a delete dated ``event_us`` removes (its cached q and label, never a raw
    input): none when it is not cached, or was added later in event time (a re-add wins over an
    older delete; None: any cached add is older); raises :class:`FeatureRejected` when another subject
    added it. Removing nothing is no refusal: the delete's tombstone still keeps the sample's
    older adds out (:func:`judge_remove_wins`)."""
    cs = view.get_sample(r.head_id, r.sample_id)  # type: ignore[arg-type]
    if cs is None:
        return []
    if cs.subject_id != r.subject_id:
        raise FeatureRejected("subject_mismatch",
                              f"sample {r.sample_id!r} was added by another subject than {r.subject_id!r}")
    return [cs] if event_us is None or cs.event_us <= event_us else []


def judge_delete_subject(r: Request, view: CacheView, event_us: int | None = None) -> list[CachedSample]:
    """Every cached sample of the subject in the head (by sample id) added at or before
    ``event_us`` (None: all); possibly none (the tombstone is what such a request leaves)."""
    found = view.subject_samples(r.head_id, r.subject_id)
    return [cs for cs in found if event_us is None or cs.event_us <= event_us]


def judge_remove_wins(r: Request, m: InMessage, view: Overlay, policy: TombstonePolicy, now: float) -> int:
    """An add's event time, checked against the clock bounds and the tombstones (remove wins,
    :func:`blocking_tombstone`); raises :class:`FeatureRejected` (``ts_in_future``, ``event_too_old``,
    ``deleted_before_arrival``)."""
    t_add = add_event_time(r, m.timestamp_ms, now, policy)
    found = [t for name in add_keys(r) for t in view.tombstones(*name)]
    block = blocking_tombstone(r, t_add, found)
    if block is not None:
        raise FeatureRejected("deleted_before_arrival",
                       f"sample {r.sample_id!r} of subject {r.subject_id!r} (head {r.head_id!r}) is dated "
                       f"{t_add / 1e6:.6f}, not after the {'delete' if block.kind == 'sample' else 'delete_subject'} "
                       f"{block.event_id!r} dated {block.event_us / 1e6:.6f}")
    return t_add


@dataclass
class Judgement:
    """What judging a batch in offset order decided: the overlay (cache after the batch), the
    rows per head, and the refusals."""

    overlay: Overlay
    rows: dict[str, HeadRows] = field(default_factory=dict)
    deadletters: list[DeadLetter] = field(default_factory=list)
    receipts: list[Receipt] = field(default_factory=list)
    accepted: int = 0

    def accept_add(self, event_id: str, cs: CachedSample, head: HeadInfo, new_head: bool) -> None:
        """Cache the sample (and a new head) and give it a ``+q`` row."""
        if new_head:
            self.overlay.heads[head.head_id] = head
        self.overlay.samples[(cs.head_id, cs.sample_id)] = cs
        self.rows.setdefault(cs.head_id, HeadRows()).add(+1, event_id, cs)
        self.accepted += 1

    def accept_deletes(self, head_id: str, event_id: str, samples: Sequence[CachedSample], event_us: int,
                       by_subject: bool, scope: str) -> None:
        """Drop the samples from the cache and give each a ``-q`` row (all with the delete's event
        id, event time, kind and tombstone scope as their client, so the verifier can rebuild its
        tombstone)."""
        hr = self.rows.setdefault(head_id, HeadRows())
        for cs in samples:
            self.overlay.samples[(head_id, cs.sample_id)] = None
            # The add's event id stays taken (a retention from the delete), its meaning (a hash of
            # the input) goes with the sample.
            self.overlay.events[(head_id, cs.event_id)] = EventMark(head_id, cs.event_id, ERASED, event_us)
            hr.add(-1, event_id, replace(cs, event_us=event_us, client_id=scope), by_subject)
        self.accepted += 1

    def tombstone_only(self, receipt: Receipt) -> None:
        """A delete that removed nothing: its tombstone is in the overlay, its receipt says so."""
        self.receipts.append(receipt)

    def refuse(self, deadletter: DeadLetter, receipt: Receipt | None) -> None:
        """Record a refusal (see :func:`refusal`)."""
        self.deadletters.append(deadletter)
        if receipt is not None:
            self.receipts.append(receipt)


def judge_batch(messages: Sequence[InMessage], reqs: Sequence[Request | InvalidRequest], encoded: EncodedAdds,
                cache: CacheView, config: CoreConfig, ts: float, screened: Screened | None = None) -> Judgement:
    """Judge the requests in offset order against ``cache`` plus the batch so far, so "add x,
    delete x" in one batch works and a duplicate add within it is caught (``screened``: signed mode)."""
    j = Judgement(Overlay(cache))
    quantize = BatchQuantizer(encoded.features.values())  # a head's rows in one call, not one each
    contracts: AutoContracts = {}
    for i, (m, r) in enumerate(zip(messages, reqs, strict=True)):
        if isinstance(r, UnopenedRequest):  # parsed, but its sealed input does not open (or is not sealed)
            j.refuse(*refusal(m, r.request, r.reason, r.detail, config, ts))
            continue
        if isinstance(r, InvalidRequest):  # signed mode answers no unauthenticated request with a receipt
            j.refuse(*refusal(m, None, r.reason, r.detail, config, ts,
                              salvage_delete_ids(m.value) if screened is None else None))
            continue
        if screened is not None and i in screened.denied:
            rej = screened.denied[i]
            dl, receipt = refusal(m, r, rej.reason, rej.detail, config, ts)
            j.refuse(dl, None if rej.reason in NO_RECEIPT_REASONS else receipt)
            continue
        client = screened.clients.get(i) if screened is not None else None
        try:
            if config.federated and r.client_id != config.client_id:
                raise FeatureRejected("wrong_client",
                               f"this federated featurizer serves client {config.client_id!r}, not {r.client_id!r}")
            fp = judge_event(r, j.overlay)
            if r.op == "add":
                t_add = judge_remove_wins(r, m, j.overlay, config.tombstones, ts)
                cs, head, new_head = judge_add(r, encoded.features.get(i), encoded.backbones.get(i), j.overlay,
                                               config, quantize, t_add, contracts)
                j.accept_add(r.event_id, cs, head, new_head)
                j.overlay.events[(r.head_id, r.event_id)] = EventMark(r.head_id, r.event_id, fp, t_add, cs.sample_id)
            else:
                t_del = judge_remove(j, r, m, config, ts, client)
                j.overlay.events[(r.head_id, r.event_id)] = EventMark(r.head_id, r.event_id, fp, t_del)
        except FeatureRejected as rej:
            dl, receipt = refusal(m, r, rej.reason, rej.detail, config, ts)
            # A resend gets no receipt of its own: the first judgement's receipt answers its event id.
            j.refuse(dl, None if rej.reason == "duplicate_event" else receipt)
    return j


def judge_remove(j: Judgement, r: Request, m: InMessage, config: CoreConfig, now: float,
                 client: ClientRecord | None) -> int:
    """A delete or delete_subject: remove what was cached at or before its event time (a
    ``-q`` row each, the ledger's applied receipt follows), and leave its tombstone (the
    deleting client's only, unless it may delete others' samples; not kept when older than the
    retention, when adds that old are refused anyway); when nothing was removed, a
    ``tombstoned`` receipt says so. Raises :class:`FeatureRejected` (``subject_mismatch``,
    ``not_owner``): then nothing is removed and no tombstone left. Returns its event time."""
    policy = config.tombstones
    t_del = delete_event_time(r, m.timestamp_ms, now, policy)
    gone = judge_delete(r, j.overlay, t_del) if r.op == "delete" else judge_delete_subject(r, j.overlay, t_del)
    if client is not None:
        Authorizer.check_owner(client, r, gone)
    horizon = policy.horizon_us(seconds_to_us(now))
    scope = "" if client is None or client.may_delete_others else client.client_id
    for t in tombstones_of(r, scope, t_del):
        if horizon is None or t.event_us >= horizon:
            j.overlay.put_tombstone(t)
    if gone:
        j.accept_deletes(r.head_id, r.event_id, gone, t_del, r.op == "delete_subject", scope)
        return t_del
    expires = None if policy.retention == 0 else t_del / 1e6 + policy.retention
    j.tombstone_only(Receipt.tombstoned(r.event_id, r.subject_id, r.head_id, [r.sample_id] if r.sample_id else [],
                                        t_del / 1e6, expires, now, scope or None))
    return t_del
