"""One way to read a topic: to its end (``read_topic``), or following it (``TopicFollower``).

Every reader in the project (the verifier, ``unlearn head``, serving, the client's receipt
listener, the demo) goes through here, so the broker rules live in one place:

- Topic metadata is asked for the *whole* cluster (``list_topics()`` with no topic): naming a
  topic in a metadata request auto-creates it on the embedded broker.
- "The end" is partition EOF as reported by fetch responses, never ListOffsets(latest), which
  the embedded broker gets wrong after multi-record batches (``infra.settings.BrokerQuirks``).
- Readers assign partitions explicitly (no consumer group, nothing committed): they never
  disturb the workers' groups and never wait for a group join.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.topic_family import TopicFamily

log = logging.getLogger("unlearn.topic_reader")

#: Where a follower starts: the first offset of each partition, or its end at start-up.
StartAt = Literal["beginning", "end"]


class TopicReadError(RuntimeError):
    """The topic could not be read: broker unreachable, topic missing, end not reached in time.
    ``kafka_error``: the client's error behind it, if any (``runtime.retry`` classifies it)."""

    kafka_error: Any = None


@dataclass(frozen=True)
class LogRecord:
    """One message as it was on its topic."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    topic: str = ""


#: What a reader reads: one topic, or a topic family (common) as its generations rotate.
Source: TypeAlias = "str | TopicFamily"

#: Seconds between metadata listings while reading a family (to see new generations).
FAMILY_RELIST_S = 1.0

#: Seconds one batch ``consume`` may block. librdkafka's batch consume returns only when the batch
#: is full or this time is up, even after the partition-EOF event arrived, so every read to the end
#: of a short log paid the whole wait: 0.2 s per partition read, i.e. about 1 s per key-family
#: refresh in the ledger (measured: 50 records + EOF in 0.20 s with 0.2, 0.02 s with 0.01).
#: A short wait only makes the loop turn more often; stalls are still judged by the idle timeout.
BATCH_WAIT_S = 0.01

TP = tuple[str, int]  # (topic, partition)


def _consumer(settings: Settings, role: str, **overrides: Any) -> Any:


    # A unique group id that is never joined: assign() + no commits.
    return clients.consumer(settings, f"{settings.topic_prefix}{role}-{uuid.uuid4().hex}",
                                    **{"enable.partition.eof": True, "enable.auto.commit": False, **overrides})


def _metadata(consumer: Any, settings: Settings, timeout: float) -> Any:
    from confluent_kafka import KafkaException

    try:
        return consumer.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise TopicReadError(f"cannot reach the broker at {settings.bootstrap}: {exc}") from exc


def topic_partitions(consumer: Any, settings: Settings, topic: str, timeout: float) -> list[int] | None:
    """The partitions of ``topic``, or None if it does not exist. Asks for the whole cluster's
    metadata: naming the topic would auto-create it on the embedded broker."""
    t = _metadata(consumer, settings, timeout).topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        return None
    return sorted(t.partitions)


def source_partitions(consumer: Any, settings: Settings, source: Source, timeout: float) -> set[TP] | None:
    """The (topic, partition) pairs to read ``source`` from now; None if it is a topic that does
    not exist (a family with no topic yet is empty, not missing).

    For a family, only the newest generation of each writer partition: its writer republished
    into it what a reader needs before it deleted (after a grace period) the older ones. Reading
    only the newest also keeps readers off topics about to be deleted: librdkafka 2.16 crashes
    (SIGSEGV in its metadata cache) when a topic that one of its consumers fetched from is
    deleted on the embedded broker, so a reader must have *closed* the consumer that read a
    superseded generation before the writer's grace period ends (``_Fetcher`` does)."""
    if isinstance(source, str):
        parts = topic_partitions(consumer, settings, source, timeout)
        return None if parts is None else {(source, p) for p in parts}
    md = _metadata(consumer, settings, timeout)
    newest: dict[int, tuple[int, str]] = {}
    for t in source.select(md.topics):
        part, gen = source.parse(t) or (0, 0)
        if md.topics[t].error is None and gen >= newest.get(part, (-1, ""))[0]:
            newest[part] = (gen, t)
    return {(t, p) for _, t in newest.values() for p in md.topics[t].partitions}


def _order(source: Source) -> Callable[[LogRecord], tuple[int, ...]]:
    """Reading order of records: (partition, offset) for a topic; for a family, by the writer's
    partition, then generation, then offset (names do not sort numerically)."""
    if isinstance(source, str):
        return lambda r: (r.partition, r.offset)
    fam = source
    return lambda r: (*(fam.parse(r.topic) or (-1, -1)), r.partition, r.offset)


def _record(m: Any) -> LogRecord:
    _, ts = m.timestamp()
    value = m.value()
    return LogRecord(m.partition(), m.offset(), int(ts), m.key(), None if value is None else bytes(value), m.topic())


class _Fetcher:
    """An assign-only consumer over a changing set of (topic, partition) pairs.

    Pairs that leave the set are forgotten by closing the consumer and opening a new one at the
    kept positions (unassigning is not enough: the client still refreshes metadata for every
    topic it has fetched from, and crashes once such a topic is deleted -- see
    ``source_partitions``)."""

    def __init__(self, settings: Settings, role: str) -> None:
        self.settings = settings
        self.role = role
        self.consumer: Any = _consumer(settings, role)
        self.positions: dict[TP, int] = {}  # next offset per assigned pair (-2: the beginning)

    def assign(self, tps: dict[TP, int]) -> None:
        from confluent_kafka import TopicPartition

        self.positions = dict(tps)
        self.consumer.assign([TopicPartition(t, p, o) for (t, p), o in sorted(tps.items())])

    def sync(self, now: set[TP]) -> tuple[set[TP], set[TP]]:
        """Follow ``now``: new pairs from their beginning, dropped pairs forgotten. Returns
        (added, dropped)."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        added, dropped = now - set(self.positions), set(self.positions) - now
        if dropped:
            keep = {tp: o for tp, o in self.positions.items() if tp not in dropped}
            keep.update(dict.fromkeys(added, OFFSET_BEGINNING))
            self.consumer.close()
            self.consumer = _consumer(self.settings, self.role)
            self.assign(keep)
        elif added:
            self.consumer.incremental_assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in sorted(added)])
            self.positions.update(dict.fromkeys(added, OFFSET_BEGINNING))
        return added, dropped

    def delivered(self, m: Any) -> None:
        self.positions[(m.topic(), m.partition())] = m.offset() + 1

    def close(self) -> None:
        self.consumer.close()


def read_topic(settings: Settings, topic: Source, keep: Callable[[bytes | None], bool] | None = None,
               timeout: float = 60.0, role: str = "reader") -> list[LogRecord]:
    """Every message of ``topic`` (all partitions, from the beginning) up to each partition's end
    when the reader got there, in (partition, offset) order. ``keep(key)`` filters before the
    value is copied. Raises ``TopicReadError`` if the topic is missing or the end is not reached
    within ``timeout`` seconds.

    A family is read from the newest generation of each writer partition (``source_partitions``);
    one that a rotation supersedes during the read is read from its beginning too."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaError

    family = not isinstance(topic, str)
    f = _Fetcher(settings, role)
    out: list[LogRecord] = []
    try:
        pending = source_partitions(f.consumer, settings, topic, min(timeout, settings.admin_timeout))
        if pending is None:
            raise TopicReadError(f"topic {topic} does not exist on {settings.bootstrap} "
                                 "(run `unlearn topics create` with the same --prefix)")
        f.assign(dict.fromkeys(pending, OFFSET_BEGINNING))
        done: set[TP] = set()
        deadline = time.monotonic() + timeout
        relisted = time.monotonic()
        while not pending <= done:
            if time.monotonic() > deadline:
                raise TopicReadError(f"reading {topic} did not reach the end of partitions "
                                     f"{sorted(pending - done)} within {timeout:g}s") from TimeoutError(topic)
            for m in f.consumer.consume(num_messages=1000, timeout=BATCH_WAIT_S):
                err = m.error()
                tp = (m.topic(), m.partition())
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(tp)
                        continue
                    failed = TopicReadError(f"reading {topic}: {err}")
                    failed.kafka_error = err  # runtime.retry classifies it
                    raise failed
                f.delivered(m)
                if tp in done or tp not in pending:
                    continue  # produced after we reached that partition's end: not ours
                if keep is not None and not keep(m.key()):
                    continue
                out.append(_record(m))
            if family and time.monotonic() - relisted >= FAMILY_RELIST_S:
                relisted = time.monotonic()
                added, dropped = f.sync(source_partitions(f.consumer, settings, topic, settings.admin_timeout) or set())
                pending = (pending - dropped) | added
                done -= dropped
    finally:
        f.close()
    out.sort(key=_order(topic))
    return out


class TopicFollower:
    """A daemon thread that hands every record of a topic (or of a topic family) to
    ``on_record``, from the beginning or from the end at ``start()``, until ``stop()``.

    Waits for the topic to exist (a service may start before ``unlearn topics create``) and for
    the broker to come back (it keeps retrying; ``error`` says why it is waiting). A family is
    followed on the newest generation of each writer partition, switching (from the new one's
    beginning) within ``FAMILY_RELIST_S`` of a rotation. ``caught_up`` is set once every
    partition has reached its end at least once. ``lag()`` is the last known lag per partition
    (from fetch responses' high watermarks), keyed by partition for a topic and by
    ``topic/partition`` for a family.
    """

    def __init__(self, settings: Settings, topic: Source, on_record: Callable[[LogRecord], None], *,
                 start_at: StartAt = "beginning", role: str = "follower", poll_interval: float = 0.1,
                 keep: Callable[[bytes | None], bool] | None = None) -> None:
        self.settings = settings
        self.topic = topic
        self.on_record = on_record
        self.start_at = start_at
        self.role = role
        self.poll_interval = poll_interval
        self.keep = keep
        self.caught_up = threading.Event()
        self.assigned = threading.Event()
        self.error: str | None = None
        self.partitions: set[TP] = set()
        self._lag: dict[int | str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, wait_assigned: float | None = None) -> TopicFollower:
        """Start the thread (idempotent). With ``wait_assigned``, block until partitions are
        assigned (so anything produced after this returns is seen) or raise ``TopicReadError``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"unlearn-{self.role}", daemon=True)
            self._thread.start()
        if wait_assigned is not None and not self.assigned.wait(wait_assigned):
            raise TopicReadError(f"could not start reading {self.topic}: {self.error or 'timed out'}")
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def lag(self) -> dict[int | str, int]:
        return dict(self._lag)

    # ---------------------------------------------------------------- thread
    def _assign(self, f: _Fetcher) -> bool:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        while not self._stop.is_set():
            try:
                parts = source_partitions(f.consumer, self.settings, self.topic, 5.0)
                if parts is not None:
                    break
                self.error = f"topic {self.topic} does not exist yet"
            except TopicReadError as exc:  # broker unreachable: keep trying
                self.error = str(exc)
            self._stop.wait(1.0)
        else:
            return False
        self.partitions = parts
        start: dict[TP, int] = {}
        for t, p in sorted(parts):
            if self.start_at == "beginning":
                start[(t, p)] = OFFSET_BEGINNING
            else:
                # The end from ListOffsets: on the embedded broker it can be slightly early
                # after multi-record batches -- harmless, a few old records are handed over.
                _, high = f.consumer.get_watermark_offsets(TopicPartition(t, p), timeout=self.settings.admin_timeout)
                start[(t, p)] = max(0, int(high))
        f.assign(start)
        if not parts:
            self.caught_up.set()
        self.error = None
        self.assigned.set()
        return True

    def _relist(self, f: _Fetcher, at_end: set[TP]) -> None:
        try:
            now = source_partitions(f.consumer, self.settings, self.topic, 5.0) or set()
        except TopicReadError as exc:  # broker away: keep what we have, say why
            self.error = str(exc)
            return
        self.error = None
        _, dropped = f.sync(now)
        at_end -= dropped
        self.partitions = now

    def _run(self) -> None:
        from confluent_kafka import KafkaError

        family = not isinstance(self.topic, str)
        f = _Fetcher(self.settings, self.role)
        try:
            if not self._assign(f):
                return
            at_end: set[TP] = set()
            last_lag = last_list = time.monotonic()
            while not self._stop.is_set():
                for m in _consume_ready(f.consumer, 500, self.poll_interval):
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            at_end.add((m.topic(), m.partition()))
                            if self.partitions <= at_end:
                                self.caught_up.set()
                        else:
                            log.warning("%s consumer: %s", self.topic, err)
                        continue
                    f.delivered(m)
                    if self.keep is not None and not self.keep(m.key()):
                        continue
                    self.on_record(_record(m))
                now = time.monotonic()
                if family and now - last_list >= FAMILY_RELIST_S:
                    last_list = now
                    self._relist(f, at_end)
                if now - last_lag >= 0.5:
                    last_lag = now
                    self._update_lag(f.consumer)
        except Exception as exc:  # reported through ``error`` (serving's /healthz shows it)
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("%s follower stopped", self.topic)
        finally:
            f.close()

    def _update_lag(self, c: Any) -> None:
        from confluent_kafka import TopicPartition

        lag: dict[int | str, int] = {}
        family = not isinstance(self.topic, str)
        try:
            for tp in c.position([TopicPartition(t, p) for t, p in sorted(self.partitions)]):
                # cached=True: the high watermark of the last fetch response.
                _, hi = c.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), cached=True)
                if hi is not None and hi >= 0 and tp.offset >= 0:
                    lag[f"{tp.topic}/{tp.partition}" if family else tp.partition] = max(0, int(hi) - int(tp.offset))
        except Exception:  # metrics only
            return
        self._lag = lag


def _consume_ready(consumer: Any, most: int, timeout: float) -> list[Any]:
    """Up to ``most`` messages: wait at most ``timeout`` for the first, then take only what is
    already fetched. Why: librdkafka's batch consume holds what it has until the batch is full
    or the timeout is up, so ``consume(500, 0.1)`` kept a lone head update from serving for up to
    0.1 s (every follower's delivery latency; the ledger worker polls the same way)."""
    first = consumer.consume(num_messages=1, timeout=timeout)
    return first + consumer.consume(num_messages=most - 1, timeout=0) if first else first


def keys_in(keys: Iterable[str]) -> Callable[[bytes | None], bool]:
    """A ``keep`` filter: records whose key is one of ``keys`` (UTF-8)."""
    wanted = {k.encode("utf-8") for k in keys}
    return lambda key: key is not None and key in wanted


def read_range(consumer: Any, topic: str, partition: int, start: int, stop: int | None,
               idle_timeout: float) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of the records at offsets [start, stop) of one partition (``stop``
    None: to the partition's end), with an assign-only ``consumer`` that has
    ``enable.partition.eof``. Raises ``TopicReadError`` if no record arrives for ``idle_timeout``
    seconds (a large range may take long: only a stall is an error). What the ledger's and the
    feature cache's changelog recoveries read with."""
    from confluent_kafka import KafkaError, TopicPartition

    consumer.assign([TopicPartition(topic, partition, start)])
    out: list[tuple[int, bytes | None, bytes | None]] = []
    deadline = time.monotonic() + idle_timeout
    while time.monotonic() < deadline:
        got = consumer.consume(num_messages=1000, timeout=BATCH_WAIT_S)
        if got:
            deadline = time.monotonic() + idle_timeout
        for m in got:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return out
                failed = TopicReadError(f"reading {topic}/{partition}: {err}")
                failed.kafka_error = err  # runtime.retry classifies it
                raise failed
            if stop is not None and m.offset() >= stop:
                return out
            out.append((m.offset(), m.key(), m.value()))
    raise TopicReadError(f"reading {topic}/{partition} from offset {start} stalled for {idle_timeout:g}s") from \
        TimeoutError(f"no record for {idle_timeout:g}s")  # transient for runtime.retry (a broker restarting)
