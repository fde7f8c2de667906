"""Events/s through Connect + Debezium + `unlearn cdc` (docs/cdc.md, "Cost").

A local Kafka node and PostgreSQL, `unlearn cdc` on a `real[]` table; one ``INSERT ... SELECT
generate_series`` of N rows (one transaction), then the time until all N adds are on ``requests``
(from the commit), and the same for one ``DELETE`` of every row. No featurizer: this is the cost
of the change stream itself. ``python -m bench.cdc_bench [N] [DIM]``."""

from __future__ import annotations

import sys
import tempfile
import time

from unlearn.runtime import clients


def main(argv: list[str]) -> int:
    import psycopg

    from unlearn.infra.local.kafka import LocalKafka
    from unlearn.infra.local.postgres import LocalPostgres
    from unlearn.infra.processes import ServiceProcess
    from unlearn.infra.settings import Settings
    from unlearn.runtime.topics import create_topics

    n = int(argv[0]) if argv else 20000
    dim = int(argv[1]) if len(argv) > 1 else 64
    kafka = LocalKafka(settings=Settings.from_env())
    kafka.start()
    pg = LocalPostgres().start()
    tmp = tempfile.mkdtemp(prefix="cdc-bench-")
    s = Settings.from_env(bootstrap=kafka.bootstrap, profile="kafka", topic_prefix="bench.", data_dir=tmp)
    cdc = None
    try:
        create_topics(s)
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id text PRIMARY KEY, owner text, label int, feat real[])")
            conn.execute("ALTER TABLE t REPLICA IDENTITY FULL")
        cdc = ServiceProcess("cdc", ["cdc", "--dsn", pg.dsn, "--table", "public.t", "--head", "h", "--sample-id", "id",
                                     "--subject-id", "owner", "--label", "label", "--features", "feat"], s, tmp).start()
        cdc.wait_for_log("unlearn cdc ready", timeout=120)
        c = clients.consumer(s, "bench", **{"auto.offset.reset": "earliest"})
        c.subscribe([s.topic("requests")])
        for what, sql in (("insert", f"INSERT INTO t SELECT 's' || i, 'u' || (i % 100), i % 10, "
                                     f"array_fill(0.5::real, ARRAY[{dim}]) FROM generate_series(1, {n}) i"),
                          ("delete", "DELETE FROM t")):
            with psycopg.connect(pg.dsn, autocommit=True) as conn:
                t0 = time.monotonic()
                conn.execute(sql)
            got = 0
            while got < n:
                got += sum(1 for m in c.consume(1000, 1.0) if m.error() is None)
                if time.monotonic() - t0 > 600:
                    raise TimeoutError(f"{what}: {got} of {n} requests in 600 s")
            dt = time.monotonic() - t0
            print(f"{what}: {n} rows (d={dim}) -> {n} requests in {dt:.1f} s: {n / dt:.0f} events/s", flush=True)
        c.close()
    finally:
        if cdc is not None:
            cdc.stop()
        pg.stop()
        kafka.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
