"""One way to read a topic: to its end (``read_topic``), or following it (``TopicFollower``).

Every reader in the project (the verifier, ``unlearn head``, serving, the client's receipt
listener, the demo) goes through here, so the broker rules live in one place:

- Topic metadata is asked for the *whole* cluster (``list_topics()`` with no topic): naming a
  topic in a metadata request auto-creates it on the embedded broker.
- "The end" is partition EOF as reported by fetch responses, never ListOffsets(latest), which
  the embedded broker gets wrong after multi-record batches (``infra.profiles.BrokerQuirks``).
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
from typing import Any, Literal

from unlearn.infra.settings import Settings

log = logging.getLogger("unlearn.topic_reader")

#: Where a follower starts: the first offset of each partition, or its end at start-up.
StartAt = Literal["beginning", "end"]


class TopicReadError(RuntimeError):
    """The topic could not be read: broker unreachable, topic missing, end not reached in time."""


@dataclass(frozen=True)
class LogRecord:
    """One message as it was on its topic."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


def _consumer(settings: Settings, role: str, **overrides: Any) -> Any:
    from confluent_kafka import Consumer

    from unlearn.infra.profiles import consumer_config

    # A unique group id that is never joined: assign() + no commits.
    return Consumer(consumer_config(settings, f"{settings.topic_prefix}{role}-{uuid.uuid4().hex}",
                                    **{"enable.partition.eof": True, "enable.auto.commit": False, **overrides}))


def topic_partitions(consumer: Any, settings: Settings, topic: str, timeout: float) -> list[int] | None:
    """The partitions of ``topic``, or None if it does not exist. Asks for the whole cluster's
    metadata: naming the topic would auto-create it on the embedded broker."""
    from confluent_kafka import KafkaException

    try:
        md = consumer.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise TopicReadError(f"cannot reach the broker at {settings.bootstrap}: {exc}") from None
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        return None
    return sorted(t.partitions)


def read_topic(settings: Settings, topic: str, keep: Callable[[bytes | None], bool] | None = None,
               timeout: float = 60.0, role: str = "reader") -> list[LogRecord]:
    """Every message of ``topic`` (all partitions, from the beginning) up to each partition's end
    when the reader got there, in (partition, offset) order. ``keep(key)`` filters before the
    value is copied. Raises ``TopicReadError`` if the topic is missing or the end is not reached
    within ``timeout`` seconds."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

    c = _consumer(settings, role)
    out: list[LogRecord] = []
    try:
        parts = topic_partitions(c, settings, topic, min(timeout, settings.admin_timeout))
        if parts is None:
            raise TopicReadError(f"topic {topic} does not exist on {settings.bootstrap} "
                                 "(run `unlearn topics create` with the same --prefix)")
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        done: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(done) < len(parts):
            if time.monotonic() > deadline:
                raise TopicReadError(f"reading {topic} did not reach the end of partitions "
                                     f"{sorted(set(parts) - done)} within {timeout:g}s")
            for m in c.consume(num_messages=1000, timeout=0.2):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(m.partition())
                        continue
                    raise TopicReadError(f"reading {topic}: {err}")
                if m.partition() in done:
                    continue  # produced after we reached that partition's end: not ours
                key = m.key()
                if keep is not None and not keep(key):
                    continue
                _, ts = m.timestamp()
                value = m.value()
                out.append(LogRecord(m.partition(), m.offset(), int(ts), key,
                                     None if value is None else bytes(value)))
    finally:
        c.close()
    out.sort(key=lambda r: (r.partition, r.offset))
    return out


class TopicFollower:
    """A daemon thread that hands every record of a topic to ``on_record``, from the beginning
    or from the end at ``start()``, until ``stop()``.

    Waits for the topic to exist (a service may start before ``unlearn topics create``) and for
    the broker to come back (it keeps retrying; ``error`` says why it is waiting). ``caught_up``
    is set once every partition has reached its end at least once. ``lag()`` is the last known
    per-partition lag (from fetch responses' high watermarks).
    """

    def __init__(self, settings: Settings, topic: str, on_record: Callable[[LogRecord], None], *,
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
        self.partitions: list[int] = []
        self._lag: dict[int, int] = {}
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

    def lag(self) -> dict[int, int]:
        return dict(self._lag)

    # ---------------------------------------------------------------- thread
    def _assign(self, c: Any) -> bool:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        while not self._stop.is_set():
            try:
                parts = topic_partitions(c, self.settings, self.topic, 5.0)
                if parts is not None:
                    break
                self.error = f"topic {self.topic} does not exist yet"
            except TopicReadError as exc:  # broker unreachable: keep trying
                self.error = str(exc)
            self._stop.wait(1.0)
        else:
            return False
        self.partitions = parts
        if self.start_at == "beginning":
            tps = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts]
        else:
            tps = []
            for p in parts:
                # The end from ListOffsets: on the embedded broker it can be slightly early
                # after multi-record batches -- harmless, a few old records are handed over.
                _, high = c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=self.settings.admin_timeout)
                tps.append(TopicPartition(self.topic, p, max(0, int(high))))
        c.assign(tps)
        self.error = None
        self.assigned.set()
        return True

    def _run(self) -> None:
        from confluent_kafka import KafkaError

        c = _consumer(self.settings, self.role)
        try:
            if not self._assign(c):
                return
            at_end: set[int] = set()
            last_lag = 0.0
            while not self._stop.is_set():
                for m in c.consume(num_messages=500, timeout=self.poll_interval):
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            at_end.add(m.partition())
                            if len(at_end) == len(self.partitions):
                                self.caught_up.set()
                        else:
                            log.warning("%s consumer: %s", self.topic, err)
                        continue
                    key = m.key()
                    if self.keep is not None and not self.keep(key):
                        continue
                    _, ts = m.timestamp()
                    value = m.value()
                    self.on_record(LogRecord(m.partition(), m.offset(), int(ts), key,
                                             None if value is None else bytes(value)))
                now = time.monotonic()
                if now - last_lag >= 0.5:
                    last_lag = now
                    self._update_lag(c)
        except Exception as exc:  # reported through ``error`` (serving's /healthz shows it)
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("%s follower stopped", self.topic)
        finally:
            c.close()

    def _update_lag(self, c: Any) -> None:
        from confluent_kafka import TopicPartition

        lag: dict[int, int] = {}
        try:
            for tp in c.position([TopicPartition(self.topic, p) for p in self.partitions]):
                # cached=True: the high watermark of the last fetch response.
                _, hi = c.get_watermark_offsets(TopicPartition(self.topic, tp.partition), cached=True)
                if hi is not None and hi >= 0 and tp.offset >= 0:
                    lag[tp.partition] = max(0, int(hi) - int(tp.offset))
        except Exception:  # metrics only
            return
        self._lag = lag


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
        got = consumer.consume(num_messages=1000, timeout=0.2)
        if got:
            deadline = time.monotonic() + idle_timeout
        for m in got:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return out
                raise TopicReadError(f"reading {topic}/{partition}: {err}")
            if stop is not None and m.offset() >= stop:
                return out
            out.append((m.offset(), m.key(), m.value()))
    raise TopicReadError(f"reading {topic}/{partition} from offset {start} stalled for {idle_timeout:g}s")
