"""Chaos benchmark: the whole pipeline under random kill -9 and a broker restart, then an audit.

    python -m bench.chaos [--quick] [--events N] [--kills K] [--broker-restart] [--json PATH]
    python -m bench.chaos --engine kafka --nodes 3 [--node-kills 3] [--no-cluster-restart] [--secure] ...

A local broker (persistent, so that it can be restarted: ``LocalBroker(data_dir=...)``), one
featurizer and one ledger worker as child processes (the operator's ``unlearn`` commands), and a
producer of request events: adds of random feature vectors and deletes of earlier adds, spread
over several heads that share ``deltas`` partitions. While events flow, the benchmark kills -9 the
ledger, the featurizer or both at random moments (and restarts them); with ``--broker-restart``
it also restarts a persistent broker once (SIGTERM, then the same port and data dir). Then it
waits for the heads to settle and audits:

- **lost / doubled events**: the deltas log is replayed with the ledger's own admission rules
  (``delta_rules.admit`` / ``apply_entries``) to see which request events reached the ledger,
  how many times; every add and delete produced must be applied exactly once;
- **digest mismatches**: each head's latest exact digest must equal a from-scratch ledger of the
  retained samples (quantized by the feature contract), and its retained-rows hash the
  from-scratch multiset hash of those rows (docs/design.md section 6);
- **(head, version) pairs with more than one digest** among the head updates that carry one
  (exact updates always do, fast ones carry none), and with more than one retained-rows hash over
  all head updates and the applied receipts (an unknown hash counts as a value of its own);
- **receipts**: every delete must have an applied receipt; duplicates are counted (identical
  duplicates are allowed by the at-least-once protocol, conflicting ones are not: a receipt names
  the version of the message that applied its delete, whatever the poll boundaries of the run);
- **recovery**: seconds from a restart to the worker's readiness line (p50 / max), and per fault
  kind the seconds from the fault to the first new head version published after it
  (``bench.publish_clock``: n, min, p50, p90, max).

With ``--engine kafka --nodes 3`` the broker is the project's Apache Kafka (``LocalKafka``, a
persistent three-node KRaft cluster: replication factor 3, ``min.insync.replicas=2``, the ``kafka``
client profile: acks=all, idempotence). Besides the worker kills it then kill -9s a random broker
node ``--node-kills`` times while a chunk of events is being produced and processed, leaves it down
for a while (longer than the broker session timeout, so its leaderships move), starts it again from
its data dir and waits until every partition is back in full ISR; the workers are left alone
during these rounds, so that they must ride through the node's loss. Once (``--cluster-restart``,
on by default with Kafka) the whole cluster is stopped under load and started again from its data
dirs. The audit then also counts **worker restarts that no kill caused** (a worker found dead is
restarted and counted): 0 means the workers rode through every node loss and the cluster restart.
With ``--secure`` the cluster is the secured one (``SecuredLocalKafka``: SASL_SSL clients and
replication, controllers over mutual TLS, a throwaway CA kept in its data dir across restarts) and
every client of the run (workers, producer, audit) connects through an ``UNLEARN_KAFKA_PROPERTIES``
file as the super user ``admin`` (the ACL matrix is tests/infra/test_secured_kafka.py's subject).

Prints a table and, with ``--json``, writes the numbers. Exit 0 iff every correctness count is 0.

Why the broker restart is opt-in: the embedded broker's only persistent engine (tansu ``s3://``
against s3rver) was measured losing acknowledged records and reusing offsets when restarted
under load (tansu ignores SIGTERM while clients are connected, so the restart ends in SIGKILL);
the workers then stop with a stale-state error rather than skip, and the audit cannot read the
damaged topics to their end. docs/design.md, "The embedded broker", has the details.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.chaos_audit import Report, Workload, audit, render
from bench.chaos_pipeline import Config, Pipeline
from unlearn.infra.local.tansu import LocalS3Unavailable
from unlearn.infra.settings import Settings
from unlearn.runtime import clients


def _produce(settings: Settings, work: Workload, n: int, producer: Any) -> None:
    topic = settings.topic("requests")
    for _ in range(n):
        key, value = work.next()
        while True:
            try:
                producer.produce(topic, key=key.encode(), value=value)
                break
            except BufferError:
                producer.poll(0.05)
    producer.poll(0)


def _probe(pipe: Pipeline, work: Workload, producer: Any) -> float:
    """One more event (an audited one) once a fault is over for the harness, so that the pipeline
    has something to publish: the clock then measures recovery, not the gap until the next chunk.
    Returns when it was sent."""
    sent = time.monotonic()
    _produce(pipe.settings, work, 1, producer)
    producer.flush(300)
    return sent


def _schedule(cfg: Config) -> list[str]:
    """What happens after each chunk of events but the last: "worker" (kill -9 of the ledger, the
    featurizer or both), "node" (kill -9 of a Kafka node during the chunk), "cluster" (restart of
    the whole Kafka cluster). Worker kills only when there are no broker faults (the tansu run's
    sequence); else the broker faults are spread over the run, none first or last."""
    actions = ["worker"] * cfg.kills
    faults = ["node"] * cfg.node_kills + (["cluster"] if cfg.cluster_restart else [])
    if not faults:
        return actions
    rng = np.random.default_rng(cfg.seed + 2)
    rng.shuffle(faults)
    n = len(actions) + len(faults)
    slots = sorted({round((j + 1) * n / (len(faults) + 1)) for j in range(len(faults))})
    out = []
    for i in range(n):
        if i in slots and faults:
            out.append(faults.pop())
        else:
            out.append(actions.pop() if actions else faults.pop())
    return out


def run(cfg: Config, root: Path) -> Report:

    report = Report(asdict(cfg), f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, "
                                 f"python {platform.python_version()}")
    rng = np.random.default_rng(cfg.seed + 1)
    faults = np.random.default_rng(cfg.seed + 3)  # which node, when: apart from rng (the tansu run's sequence)
    t0 = time.monotonic()
    report.loadavg.append(round(os.getloadavg()[0], 2))
    try:
        pipe = Pipeline(root, cfg)
    except LocalS3Unavailable as exc:
        print(f"persistent broker unavailable ({exc}); running without the broker restart", file=sys.stderr)
        cfg.broker_restart = False
        report.config["broker_restart"] = False
        pipe = Pipeline(root, cfg)
    work = Workload(cfg)

    def note(what: str) -> None:
        report.timeline.append(f"{time.monotonic() - t0:7.1f} s  {what}")
        print(report.timeline[-1], file=sys.stderr, flush=True)

    failed: list[tuple[bytes, bytes]] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            report.produce_errors += 1
            failed.append((msg.key(), msg.value()))

    def resend_failed() -> None:
        """Send again what a fault made fail, as an at-least-once app does: the same event (id and
        content), so a copy that did land is a duplicate to the featurizer (docs/featurizer.md,
        "Event ids"), never a second application; a fresh producer, the faulted one may be stuck."""
        for _ in range(5):
            if not failed:
                return
            again, failed[:] = list(failed), []
            retry = clients.producer(pipe.settings, **{"on_delivery": on_delivery})
            for key, value in again:
                retry.produce(pipe.settings.topic("requests"), key=key, value=value)
            report.produce_resent += len(again)
            retry.flush(120)

    try:
        pipe.start_workers()
        actions = _schedule(cfg)
        n_chunks = len(actions) + 1
        chunk = max(1, cfg.events // n_chunks)
        restart_at = n_chunks // 2 if cfg.broker_restart and cfg.engine == "tansu" else -1
        for i in range(n_chunks):
            n = chunk if i < n_chunks - 1 else cfg.events - work.n  # the probes (_probe) included
            producer = clients.producer(pipe.settings, **{"linger.ms": 5, "on_delivery": on_delivery})

            def produce(n: int = n, producer: Any = producer) -> None:
                _produce(pipe.settings, work, n, producer)
                left = producer.flush(300)  # retries until message.timeout.ms; a fault only delays
                report.produce_errors += left
                resend_failed()

            action = actions[i] if i < len(actions) else None
            if action == "node":
                node = int(faults.integers(1, cfg.nodes + 1))
                delay = float(faults.uniform(0.0, 0.5))
                note(f"chunk {i}: {n} events; kill -9 Kafka node {node} {delay:.2f} s into the chunk")
                t_fault = time.monotonic() + delay  # the killer thread's moment, within a few ms
                answered = pipe.kill_node_under_load(node, delay, produce)
                pipe.clock.record("kafka node kill -9", t_fault)
                report.node_kills.append(node)
                report.node_outage_s.append(round(answered, 2))
                note(f"node {node} restarted, answering {answered:.1f} s after the kill; full ISR after "
                     f"{pipe.recovery['node_isr'][-1]:.1f} s more")
                pipe.check_workers()
                continue
            produce()
            if i == n_chunks - 1:
                break
            time.sleep(float(rng.uniform(0.0, 1.5)))  # somewhere mid-processing / mid-checkpoint
            t_fault = time.monotonic()
            if i == restart_at:
                pipe.restart_broker()
                report.broker_restarts += 1
                pipe.clock.record("broker restart", t_fault, _probe(pipe, work, producer))
                t_fault = time.monotonic()
            if action == "cluster":
                note(f"chunk {i}: {n} events; stop the whole cluster, start it from its data dirs")
                took = pipe.restart_cluster()
                pipe.clock.record("cluster restart" if cfg.nodes > 1 else "broker restart (one node)", t_fault,
                                  _probe(pipe, work, producer))
                resend_failed()
                report.cluster_restarts += 1
                note(f"cluster answering {took:.1f} s after the stop; full ISR after "
                     f"{pipe.recovery['cluster_isr'][-1]:.1f} s more")
            else:
                which = ("ledger", "featurizer", "both")[int(rng.integers(3))]
                pipe.kill(which)
                pipe.clock.record(f"kill -9 {which}", t_fault, _probe(pipe, work, producer))
                report.kills.append(which)
                note(f"chunk {i}: {n} events; kill -9 {which}")
            pipe.check_workers()
        resend_failed()
        report.events_produced = work.n
        report.adds, report.deletes = len(work.add_events), len(work.delete_events)
        note("all produced; settling and auditing")
        audit(pipe, work, report)
        pipe.check_workers()
        note("audit done")
    finally:
        report.unplanned_worker_restarts = pipe.unplanned_restarts
        report.examples += [u[:2000] for u in pipe.unplanned[:3]]
        pipe.stop()
    report.recovery_s = {k: [round(x, 3) for x in v] for k, v in pipe.recovery.items()}
    report.publish_after_fault_s = dict(pipe.clock.after_fault)
    report.elapsed_s = round(time.monotonic() - t0, 1)
    report.loadavg.append(round(os.getloadavg()[0], 2))
    return report


def _keep_logs(root: Path) -> Path:
    """The ``*.log`` files of a run's temporary directory (workers', Kafka nodes'), copied to a new
    directory that outlives it: a run that is not exact is worth reading (without ``--workdir``,
    everything else goes with the temporary directory)."""
    kept = Path(tempfile.mkdtemp(prefix="unlearn-chaos-logs-"))
    for log in root.rglob("*.log"):
        if log.is_file() and "data" not in log.relative_to(root).parts[:-1]:
            dest = kept / log.relative_to(root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(log, dest)
    return kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5k events, 6 kills (what make test runs)")
    ap.add_argument("--events", type=int)
    ap.add_argument("--kills", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--broker-restart", action="store_true",
                    help="also restart a persistent broker once (see the module docstring)")
    ap.add_argument("--engine", choices=("tansu", "kafka"), default="tansu",
                    help="the broker: the embedded tansu, or the project's Apache Kafka (make kafka)")
    ap.add_argument("--nodes", type=int, default=1, help="Kafka nodes (3: replication factor 3, min ISR 2)")
    ap.add_argument("--node-kills", type=int,
                    help="kill -9 of a random Kafka node under load, restarted later (default: 3 with 3+ nodes)")
    ap.add_argument("--cluster-restart", action=argparse.BooleanOptionalAction, default=None,
                    help="stop the whole Kafka cluster once under load and start it from its data dirs "
                         "(default: on with --engine kafka)")
    ap.add_argument("--secure", action="store_true",
                    help="kafka only: the secured cluster (SASL_SSL, mutual TLS controllers, a throwaway CA); "
                    "every client through an UNLEARN_KAFKA_PROPERTIES file, as admin")
    ap.add_argument("--json", type=Path, help="write the report as JSON here")
    ap.add_argument("--workdir", type=Path, help="keep logs and data here (default: a temp dir)")
    args = ap.parse_args(argv)
    cfg = Config(events=5_000, kills=6) if args.quick else Config()
    if args.events:
        cfg.events = args.events
    if args.kills is not None:
        cfg.kills = args.kills
    cfg.seed = args.seed
    cfg.broker_restart = args.broker_restart
    if args.engine == "tansu" and (args.nodes != 1 or args.node_kills or args.cluster_restart):
        ap.error("--nodes, --node-kills and --cluster-restart need --engine kafka")
    if args.engine == "kafka" and args.broker_restart:
        ap.error("--broker-restart is tansu's; with Kafka use --node-kills / --cluster-restart")
    if args.secure and args.engine != "kafka":
        ap.error("--secure needs --engine kafka")
    cfg.engine, cfg.nodes, cfg.secure = args.engine, args.nodes, args.secure
    cfg.node_kills = args.node_kills if args.node_kills is not None else (3 if args.nodes >= 3 else 0)
    if cfg.node_kills and cfg.nodes < 3:
        ap.error("--node-kills needs --nodes 3 or more (one node down must leave min.insync.replicas=2)")
    cfg.cluster_restart = args.engine == "kafka" if args.cluster_restart is None else args.cluster_restart
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        report = run(cfg, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="unlearn-chaos-") as tmp:
            report = run(cfg, Path(tmp))
            if not report.exact:
                kept = _keep_logs(Path(tmp))
                print(f"not exact: the workers' and nodes' logs are kept in {kept}", file=sys.stderr)
    print(render(report))
    if args.json:
        args.json.write_text(orjson.dumps(asdict(report), option=orjson.OPT_INDENT_2).decode())
    return 0 if report.exact else 1


if __name__ == "__main__":
    sys.exit(main())
