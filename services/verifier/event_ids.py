"""One event id of a head means one request, judged again on the replayed log (check ``event_ids``).

The featurizer refuses a request whose (head, event id) already took effect (``duplicate_event``,
``event_id_conflict``, ``event_id_erased``: docs/featurizer.md, "Event ids"), and it keeps an
add's event id for as long as its sample is cached, whatever the memory's retention. So in log
order no applied add may carry the event id of an add still retained, and no applied delete the
event id of an add still retained (one id, two requests). What the log cannot show is left alone:
marks that expired after the retention are the featurizer's to forget, and the verifier does not
know when they did.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unlearn.schemas.delta_codec import PackedEntry, RowsEntry, SealedRowsEntry

from .certificate import Check

__all__ = ["EventIds", "check_event_ids"]

MAX_PROBLEMS = 20
"""Problems kept for the certificate (the count is exact)."""


@dataclass
class EventIds:
    """The applied entries' event ids in log order: the retained adds' ids (per sample the stack of
    adds no delete removed yet, as ``remove_wins.EventTimes`` matches them) and what broke the rule."""

    by_sample: dict[str, list[str]] = field(default_factory=dict)  # sample -> add event ids, oldest first
    retained: dict[str, int] = field(default_factory=dict)  # add event id -> retained rows carrying it
    problems: list[str] = field(default_factory=list)
    count: int = 0

    def _problem(self, text: str) -> None:
        self.count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    def apply(self, e: RowsEntry | PackedEntry | SealedRowsEntry) -> None:
        """One applied entry: its adds join (refused here when their id is taken), its deletes
        remove the latest earlier add of each sample (their own id must not be a retained add's)."""
        if e.sign > 0:
            for ev, sample in zip(e.event_ids, e.sample_ids, strict=True):
                if self.retained.get(ev, 0) > 0:
                    self._problem(f"add of sample {sample!r} carries event id {ev!r} of an add still retained")
                self.retained[ev] = self.retained.get(ev, 0) + 1
                self.by_sample.setdefault(sample, []).append(ev)
            return
        for ev in dict.fromkeys(e.event_ids):
            if self.retained.get(ev, 0) > 0:
                self._problem(f"delete event {ev!r} carries the event id of an add still retained")
        for sample in e.sample_ids:
            stack = self.by_sample.get(sample)
            if stack:
                add_ev = stack.pop()
                self.retained[add_ev] -= 1


def check_event_ids(ids: EventIds) -> Check | None:
    """``event_ids``: no applied add or delete reused the event id of an add still retained.
    Only reported when it fails (the rule holds for every log the featurizer writes)."""
    if not ids.count:
        return None
    return Check("event_ids", "fail",
                 f"{ids.count} applied rows reuse the event id of an add still retained: one event id, two requests",
                 {"violations": ids.count, "examples": ids.problems})
