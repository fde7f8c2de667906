"""``unlearn cdc``: a PostgreSQL table trains and untrains a head (docs/cdc.md).

It runs Kafka Connect standalone with Debezium for the table (``connect.py``), reads the change
topic, maps each change to the head's requests (``events.py``) and produces them to ``requests``;
what cannot become a request goes to ``deadletter``. At least once, end to end: the change
topic's offsets are committed only after the requests are acknowledged, Connect's source offsets
after Debezium's records are; whatever a crash replays is the same event with the same id. Once
forwarded, the change records (which hold the rows' features) are trimmed from the change topic
with DeleteRecords: the row's bytes then live only where the rest of the system erases them.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from unlearn.infra.cli_args import add_worker_args, log_ready, settings_from_args, setup_logging
from unlearn.infra.settings import ErasureSettings, Settings
from unlearn.runtime import clients
from unlearn.runtime.clients import quirks
from unlearn.runtime.topics import TopicError
from unlearn.schemas.deadletter import DeadLetter, encode_deadletter

from .connect import ConnectProcess, PgTarget, connector_config, find_connect_jars, worker_config
from .events import Refusal, TableMap, change_requests, event_us, is_snapshot
from .postgres import CdcSourceError, check_table, drop_slot, slot_exists, slot_name, wait_slot_free
from .settings import CdcSettings
from .state import check_resumable, read_floor, write_floor

__all__ = ["CdcBridge", "cdc_main", "change_topic"]

log = logging.getLogger("unlearn.cdc")
STAGE = "cdc"


def change_topic(settings: Settings, table: str) -> str:
    """Debezium's topic of ``table``: ``<topic.prefix>.<schema>.<table>`` with the prefix ``<prefix>cdc``."""
    return f"{settings.topic('cdc')}.{table}"


class CdcBridge:
    """Change topic -> requests and deadletter, committing the change offsets after delivery."""

    def __init__(self, settings: Settings, m: TableMap, topic: str, group: str, floor_path: Path) -> None:

        self.floor_path = floor_path
        self.floor = self._floor_saved = read_floor(floor_path)
        self.s, self.m, self.topic = settings, m, topic
        self.consumer = clients.consumer(settings, group, **{"enable.auto.commit": False,
                                                                     "auto.offset.reset": "earliest"})
        self.producer = clients.producer(settings)
        self.consumer.subscribe([topic])
        self.forwarded = 0
        self.refused = 0
        self.committed: dict[int, int] = {}
        self.trimmed: dict[int, int] = {}
        self._last_trim = 0.0

    def _deadletter(self, r: Refusal, msg: Any) -> None:
        # The row's key (its primary key, no features) is the original: the row itself is at its source.
        rec = DeadLetter(original=msg.key() or b"", reason=r.reason, detail=r.detail, stage=STAGE, topic=msg.topic(),
                         partition=msg.partition(), offset=msg.offset(), key=msg.key(), event_id=r.event_id,
                         ts=time.time())
        self.producer.produce(self.s.topic("deadletter"), key=msg.key(), value=encode_deadletter(rec))
        self.refused += 1
        log.warning("change at %s[%d]@%d refused: %s", msg.topic(), msg.partition(), msg.offset(), r)

    def step(self, timeout: float = 0.2) -> int:
        """Forward one batch of changes; returns how many change records it read."""
        msgs = self.consumer.consume(500, timeout)
        todo = [m for m in msgs if m.error() is None]
        for msg in msgs:
            if msg.error() is not None:
                log.warning("change topic: %s", msg.error())
        for msg in todo:
            value = msg.value()
            try:
                envelope = None if value is None else orjson.loads(value)
            except orjson.JSONDecodeError as exc:
                self._deadletter(Refusal("cdc_bad_event", f"not JSON: {exc}"), msg)
                continue
            if is_snapshot(envelope) and (t := event_us(envelope)) is not None and t + 1 > self.floor:
                self.floor = t + 1
            for out in change_requests(self.m, envelope, self.floor):
                if isinstance(out, Refusal):
                    self._deadletter(out, msg)
                else:
                    self.producer.produce(self.s.topic("requests"), key=out["sample_id"].encode(),
                                          value=orjson.dumps(out))
                    self.forwarded += 1
        if todo:
            if self.producer.flush(60) != 0:
                raise RuntimeError("requests not acknowledged in 60 s; the changes will be read again")
            if self.floor != self._floor_saved:  # before the commit: a re-read batch gets the same floor
                write_floor(self.floor_path, self.floor)
                self._floor_saved = self.floor
            from confluent_kafka import TopicPartition

            ends: dict[int, int] = {}
            for m in todo:
                p, o = m.partition(), m.offset()
                if p is not None and o is not None:
                    ends[p] = o + 1
            done = self.consumer.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in ends.items()],
                                        asynchronous=False) or []
            for tp in done:  # errors are per partition: a failed one is read again, never trimmed
                if tp.error is None:
                    self.committed[tp.partition] = tp.offset
                else:
                    log.warning("commit of %s[%d] failed (read again): %s", tp.topic, tp.partition, tp.error)
        return len(todo)

    def trim(self, every: float) -> None:
        """DeleteRecords below the committed offsets: forwarded rows leave the change topic."""
        if every <= 0 or not self.committed or not quirks(self.s).delete_records or self.committed == self.trimmed:
            return
        if time.monotonic() - self._last_trim < every:
            return
        from unlearn.runtime.topics import TopicError, delete_records

        try:
            below = dict(self.committed)
            delete_records(self.s, {(self.topic, p): o for p, o in below.items()})
            self.trimmed = below
            self._last_trim = time.monotonic()
        except TopicError as exc:
            log.warning("trim of %s failed (retried): %s", self.topic, exc)

    def close(self) -> None:
        self.producer.flush(30)
        self.consumer.close()


def run_cdc(settings: Settings, m: TableMap, pg: PgTarget, slot: str, state_dir: Path) -> int:
    """Run Connect and the bridge until SIGTERM/SIGINT; restart Connect when it dies or its task fails."""
    from unlearn.runtime.topics import ensure_topic, raw_input_config, wait_for_topics

    cdc = CdcSettings.of(settings)
    check_table(pg.dsn, m.table, [m.sample_id, m.subject_id, m.label, m.features])
    wait_for_topics(settings, [settings.topic("requests"), settings.topic("deadletter")])  # `unlearn topics create`
    topic = change_topic(settings, m.table)
    # One partition: the changes of a table stay in commit order. Trimmed like a raw-input topic.
    ensure_topic(settings, topic, partitions=1, config=raw_input_config(settings))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    connect = ConnectProcess(find_connect_jars(cdc.connect_jars), state_dir,
                             worker_config(settings, state_dir, 0, cdc.connect_flush_ms),
                             connector_config(f"unlearn-cdc-{slot}", pg, m.table, settings.topic("cdc"), slot),
                             heap_mb=cdc.connect_heap_mb)
    bridge = CdcBridge(settings, m, topic, f"{settings.topic_prefix}cdc.{slot}", state_dir / "snapshot.floor")
    trim_every = ErasureSettings.of(settings).trim_every_seconds
    running = False
    next_check = 0.0
    restarts = 0
    try:
        wait_slot_free(pg.dsn, slot)
        check_resumable(state_dir, slot_exists(pg.dsn, slot), slot)
        connect.start()
        while not stop.is_set():
            bridge.step()
            bridge.trim(trim_every)
            if time.monotonic() < next_check:
                continue
            next_check = time.monotonic() + 2.0
            state = connect.task_state() if connect.alive else "DEAD"
            if state == "RUNNING" and not running:
                running = True
                connect.forget_config()  # read at start: the secrets leave the disk
                log.info("connect task running (connect start %d)", restarts)
                if restarts == 0:
                    log_ready("cdc", table=m.table, head=m.head, topic=topic, slot=slot)
            elif state in ("FAILED", "DEAD"):
                running = False
                restarts += 1
                log.error("connect %s; restart %d: %s", state.lower(), restarts, connect.log_tail(1500))
                connect.stop()
                stop.wait(min(30.0, 0.5 * 2 ** min(restarts, 6)))  # a config error must not spin
                wait_slot_free(pg.dsn, slot)
                check_resumable(state_dir, True, slot)
                connect.start()
        log.info("unlearn cdc stopping: %d requests forwarded, %d changes refused", bridge.forwarded, bridge.refused)
    finally:
        connect.stop()
        bridge.close()
    return 0


def cdc_main(argv: list[str]) -> int:
    """``unlearn cdc --dsn DSN --table SCHEMA.TABLE --head HEAD --sample-id COL ...`` (docs/cdc.md)."""
    ap = argparse.ArgumentParser(prog="unlearn cdc", description="Stream a PostgreSQL table into a head's "
                                 "requests with Debezium: rows inserted train it, deleted untrain it.")
    ap.add_argument("--dsn", required=True, help="postgresql://user[:password]@host[:port]/dbname (needs REPLICATION)")
    ap.add_argument("--table", required=True, help="SCHEMA.TABLE (REPLICA IDENTITY FULL)")
    ap.add_argument("--head", required=True, help="the head the rows train")
    ap.add_argument("--sample-id", required=True, metavar="COL", help="the sample id column (unique)")
    ap.add_argument("--subject-id", required=True, metavar="COL", help="the data subject column")
    ap.add_argument("--label", required=True, metavar="COL", help="the class index column (integer)")
    ap.add_argument("--features", required=True, metavar="COL",
                    help="real[], double precision[], or bytea (<f4 values, or a PNG for the head's backbone)")
    ap.add_argument("--client-id", default="cdc", help="client_id of the requests (default: cdc)")
    ap.add_argument("--slot", help="replication slot and publication name (default: derived from head and table)")
    ap.add_argument("--drop-slot", action="store_true",
                    help="drop the replication slot and publication, then exit (stop streaming for good)")
    add_worker_args(ap, CdcSettings, ErasureSettings)
    args = ap.parse_args(argv)
    setup_logging(args.loglevel)
    if args.table.count(".") != 1:
        ap.error("--table must be SCHEMA.TABLE")
    try:
        pg = PgTarget.parse(args.dsn)
        settings = settings_from_args(args, require_broker=not args.drop_slot)
    except ValueError as exc:
        ap.error(str(exc))
    slot = args.slot or slot_name(args.head, args.table)
    try:
        if args.drop_slot:
            dropped = drop_slot(pg.dsn, slot)
            print("dropped: " + (", ".join(dropped) or "nothing (no slot or publication named " + slot + ")"))
            return 0
        m = TableMap(args.table, args.head, args.sample_id, args.subject_id, args.label, args.features, args.client_id)
        state_dir = Path(settings.data_dir) / "cdc" / slot
        return run_cdc(settings, m, pg, slot, state_dir)
    except (CdcSourceError, TopicError) as exc:
        log.error("%s", exc)
        return 2
