"""What `unlearn cdc` asks PostgreSQL itself: is the table streamable, is the slot free, drop it.

Debezium creates the replication slot and the publication; these checks run before it starts so
that a misconfigured table is refused at once with the fix, not as a stream of dead letters."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["CdcSourceError", "check_table", "drop_slot", "slot_exists", "slot_name", "wait_slot_free"]


class CdcSourceError(RuntimeError):
    """The table or server cannot feed a head as configured; the message says what to change."""


def _connect(dsn: str) -> Any:
    import psycopg

    return psycopg.connect(dsn, autocommit=True, connect_timeout=10)


def slot_name(head: str, table: str) -> str:
    """A replication slot (and publication) name per (head, table): [a-z0-9_], at most 63."""
    import hashlib
    import re

    base = re.sub(r"[^a-z0-9_]", "_", f"unlearn_{head}_{table}".lower())[:50]
    return f"{base}_{hashlib.sha256(f'{head}/{table}'.encode()).hexdigest()[:8]}"


def check_table(dsn: str, table: str, columns: list[str]) -> None:
    """The server has ``wal_level=logical``, the table exists with the columns, and its replica
    identity is FULL (a delete must carry the subject id, an update the old label and features)."""
    schema, _, name = table.partition(".")
    with _connect(dsn) as conn:
        wal = conn.execute("SHOW wal_level").fetchone()[0]
        if wal != "logical":
            raise CdcSourceError(f"wal_level is {wal!r}: set wal_level=logical in postgresql.conf and restart")
        row = conn.execute("SELECT c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                           "WHERE n.nspname = %s AND c.relname = %s", (schema, name)).fetchone()
        if row is None:
            raise CdcSourceError(f"no table {table}")
        cols = {r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns "
                                           "WHERE table_schema = %s AND table_name = %s", (schema, name))}
        missing = [c for c in columns if c not in cols]
        if missing:
            raise CdcSourceError(f"table {table} has no column {', '.join(missing)}")
        if row[0] != "f":
            raise CdcSourceError(f"table {table} has REPLICA IDENTITY {'default' if row[0] == 'd' else row[0]}: a "
                                 f"delete would not carry the subject id: ALTER TABLE {table} REPLICA IDENTITY FULL")


def wait_slot_free(dsn: str, slot: str, timeout: float = 60.0) -> None:
    """Wait until no walsender holds ``slot`` (a killed Connect's connection is gone), and
    terminate one that still does after half the timeout: it can only be our own dead feed."""
    deadline = time.monotonic() + timeout
    with _connect(dsn) as conn:
        while True:
            row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
            if row is None or row[0] is None:
                return
            if time.monotonic() > deadline - timeout / 2:
                conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
            if time.monotonic() > deadline:
                raise CdcSourceError(f"replication slot {slot} is still held by pid {row[0]}")
            time.sleep(0.5)


def slot_exists(dsn: str, slot: str) -> bool:
    """Whether the replication slot is there (Debezium creates it on its first start)."""
    with _connect(dsn) as conn:
        return conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone() is not None


def drop_slot(dsn: str, slot: str) -> list[str]:
    """Drop the replication slot and the publication of ``slot`` (what stopping for good means:
    a slot left behind keeps WAL on the server forever). Returns what it dropped."""
    dropped = []
    wait_slot_free(dsn, slot, timeout=20.0)
    with _connect(dsn) as conn:
        if conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            dropped.append(f"slot {slot}")
        if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (slot,)).fetchone():
            conn.execute(f'DROP PUBLICATION "{slot}"')
            dropped.append(f"publication {slot}")
    return dropped
