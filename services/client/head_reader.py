"""Read the latest head updates from ``heads`` (what `unlearn head`, the demo and tests use).

``heads`` is compacted on Kafka; tansu never compacts, so readers scan from the beginning to the
high watermarks and keep the newest update per head: a higher version wins, and at equal
versions an exact update supersedes a fast one.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable

import orjson
from confluent_kafka import Consumer, KafkaError, TopicPartition

from unlearn.infra.cli_args import CliUsageError, settings_from_args
from unlearn.infra.profiles import consumer_config
from unlearn.infra.settings import Settings
from unlearn.schemas.delta_codec import CodecError
from unlearn.schemas.head_codec import HeadUpdate, decode_head, head_to_json


def newer(a: HeadUpdate, b: HeadUpdate | None) -> bool:
    """Is ``a`` newer than ``b``? (version, exact > fast)."""
    if b is None:
        return True
    return (a.version, a.mode == "exact") > (b.version, b.mode == "exact")


def read_heads(settings: Settings, head_ids: Iterable[str] | None = None, timeout: float = 30.0) -> dict[str, HeadUpdate]:
    """Latest update per head, scanning ``heads`` up to the current high watermarks."""
    wanted = set(head_ids) if head_ids is not None else None
    topic = settings.topic("heads")
    # Read to partition EOF (from Fetch responses) rather than to ListOffsets(latest), which tansu
    # gets wrong after multi-record batches (infra.profiles.BrokerQuirks).
    c = Consumer(consumer_config(settings, f"{settings.topic_prefix}head-reader-{time.time_ns()}",
                                 **{"enable.partition.eof": True}))
    latest: dict[str, HeadUpdate] = {}
    try:
        md = c.list_topics(topic, timeout=timeout)
        if md.topics.get(topic) is None or md.topics[topic].error is not None:
            raise RuntimeError(f"topic {topic} does not exist (run `unlearn topics create`)")
        parts = sorted(md.topics[topic].partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        deadline = time.monotonic() + timeout
        done: set[int] = set()
        while len(done) < len(parts):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} did not reach the end within {timeout}s")
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    done.add(m.partition())
                continue
            key = (m.key() or b"").decode("utf-8", "replace")
            if wanted is not None and key not in wanted:
                continue
            try:
                h = decode_head(m.value())
            except CodecError:
                continue  # not ours to judge here; the serving layer reports bad updates
            if newer(h, latest.get(h.head_id)):
                latest[h.head_id] = h
    finally:
        c.close()
    return latest


def wait_for_head(settings: Settings, head_id: str, predicate, timeout: float = 60.0, poll: float = 0.5) -> HeadUpdate:
    """Poll until the head's latest update satisfies ``predicate`` (tests and the demo use it)."""
    deadline = time.monotonic() + timeout
    last: HeadUpdate | None = None
    while time.monotonic() < deadline:
        last = read_heads(settings, [head_id], timeout=max(1.0, deadline - time.monotonic())).get(head_id)
        if last is not None and predicate(last):
            return last
        time.sleep(poll)
    got = "nothing" if last is None else f"version {last.version} ({last.mode}, n={last.n_retained})"
    raise TimeoutError(f"head {head_id!r} did not reach the expected state within {timeout}s (last: {got})")


def head_main(argv: list[str] | None = None) -> int:
    """``unlearn head --bootstrap B --head H [--json]``: print the latest head."""
    ap = argparse.ArgumentParser(prog="unlearn head", description="Print the latest published head.")
    ap.add_argument("--bootstrap")
    ap.add_argument("--head", required=True)
    ap.add_argument("--json", action="store_true", help="one JSON object incl. weights (d rows x c columns)")
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args(argv)
    try:
        settings = settings_from_args(args)
    except CliUsageError as exc:
        ap.error(str(exc))
    h = read_heads(settings, [args.head], timeout=args.timeout).get(args.head)
    if h is None:
        print(f"error: no head {args.head!r} published on {settings.topic('heads')}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(orjson.dumps(head_to_json(h)).decode() + "\n")
    else:
        print(f"head {h.head_id}  version {h.version}  mode {h.mode}  n_retained {h.n_retained}  "
              f"events {h.events_covered}\ndigest {h.digest}\nweights {h.weights.shape[0]} x {h.weights.shape[1]}  "
              f"gamma {h.gamma}  drift at last reset {h.drift:.3g}")
    return 0
