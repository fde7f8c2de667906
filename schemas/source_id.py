"""The ``source_id`` that ties a delta back to the requests it was made from,
``"<stream>/<partition>@<offset>"``.

A featurizer stamps each delta with the stream, partition and the last input offset the delta
covers. A delta re-produced after a featurizer crash (transactional outbox replay) therefore
carries a source offset the ledger has already covered, and the ledger skips it. The ledger, the
verifier and the featurizer all read the convention from here (docs/featurizer.md).
"""

from __future__ import annotations

import re

__all__ = [
    "LANE_SUFFIX",
    "dedup_key",
    "format_source_id",
    "parse_source",
    "parse_source_id",
    "source_stream",
]


_SOURCE_RE = re.compile(r"^(.*)/(\d+)@(\d+)$")

#: Appended to the source stream of a featurizer's delete-lane deltas (docs/featurizer.md, "The
#: delete lane"): ``"requests#deletes/<partition>@<offset>"``. Ids never hold ``#``, so the
#: ledger can tell a lane's delta from its bytes (``streams/ledger/deltas_poller.py``).
LANE_SUFFIX = "#deletes"


def format_source_id(partition: int, offset: int, stream: str = "requests") -> str:
    """``"<stream>/<partition>@<offset>"`` for a delta covering ``partition`` up to ``offset``."""
    if partition < 0 or offset < 0:
        raise ValueError(f"partition and offset must be >= 0, got {partition}, {offset}")
    if not stream:
        raise ValueError("stream must be non-empty")
    return f"{stream}/{int(partition)}@{int(offset)}"


def parse_source(source_id: str) -> tuple[str, int, int] | None:
    """``"<stream>/<partition>@<offset>"`` -> (stream, partition, offset); None if not that form."""
    m = _SOURCE_RE.match(source_id) if isinstance(source_id, str) else None
    if m is None or not m.group(1):
        return None
    return m.group(1), int(m.group(2)), int(m.group(3))


def parse_source_id(source_id: str) -> tuple[int, int] | None:
    """``"<stream>/<partition>@<offset>"`` -> (partition, offset); None if not that form. For
    callers that know the stream already; use :func:`parse_source` when the stream matters
    (federated sites use their own stream names)."""
    parsed = parse_source(source_id)
    return None if parsed is None else (parsed[1], parsed[2])


def dedup_key(source_id: str) -> tuple[str, int] | None:
    """("<stream>/<partition>", offset): what the ledger tracks per head to skip re-produced
    deltas; None for sources outside the convention (no producer-side dedup for them)."""
    parsed = parse_source(source_id)
    return None if parsed is None else (f"{parsed[0]}/{parsed[1]}", parsed[2])


def source_stream(requests_topic: str, topic_prefix: str = "", client_id: str | None = None) -> str:
    """The stream name in source ids: the requests topic without the deployment prefix (so the
    shared topic is ``"requests"``), plus ``[<client_id>]`` for a federated site, so deltas of
    different sites never share a dedup key in the ledger."""
    name = requests_topic
    if topic_prefix and name.startswith(topic_prefix) and len(name) > len(topic_prefix):
        name = name[len(topic_prefix):]
    return f"{name}[{client_id}]" if client_id is not None else name
