"""``unlearn demo`` (= ``make demo``): the whole system end to end on real offline data.

Starts a local tansu broker, a featurizer and a ledger worker as real processes, streams a
dataset as add events from several clients, then runs the paper's scenarios through the event
stream -- chunked deletions (20% of the data per step), a burst of single-sample deletions with
receipts, and re-adding them -- and ends with accuracy per phase, delete-to-head latency,
throughput, the replay verifier's certificate and an exactness line. Writes demo-out/report.json
and demo-out/phases.png.
"""

from __future__ import annotations

import argparse
import base64
import io
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from unlearn.infra.local.engine import ENGINES, describe_engine, local_broker
from unlearn.infra.local.kafka import LocalKafka
from unlearn.infra.local.tansu import LocalBroker, free_port
from unlearn.infra.polling import poll_until
from unlearn.infra.processes import ServiceDied, ServiceProcess, watch_services
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.ledger import Quantizer, l2_normalize
from unlearn.runtime import clients
from unlearn.runtime.topic_reader import LogRecord, TopicFollower
from unlearn.runtime.topics import create_topics
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.head import HeadUpdate
from unlearn.schemas.head_scores import score_rows
from unlearn.schemas.receipts import decode_receipt
from unlearn.schemas.request_inputs import FeaturesInput, ImageInput, SealedInput, TextInput
from unlearn.schemas.signature import Signer
from unlearn.services.client.head_reader import HeadFollower
from unlearn.services.client.settings import ClientSettings
from unlearn.services.client.transit_key_cache import TransitKeyCache, seal_for_transit, transit_producer_overrides
from unlearn.services.demo.report import Phase, build_report, served_predictions, write_report
from unlearn.services.serving.settings import ServeSettings

#: What ``demo-out/`` keeps of a run; a run removes the last run's before it starts: its broker is
#: new (in memory, or Kafka in a temporary directory), and workers' state from another broker is
#: rightly refused by the workers (docs/featurizer.md, "Local state").
RUN_DIRS = ("state", "logs", "keys")
SERVICES = ("featurizer", "ledger", "serve")
SERVE_PROBES = 20  # test inputs sent through `unlearn serve` at the end
WARMUP_HEAD = "demo-warmup"  # the head of the one warm-up add (not part of the report)


def _bar(iterable: Any = None, **kw: Any) -> tqdm[Any]:
    """A progress bar where a person watches: none when stderr is a file or a CI log (``disable=None``)."""
    return tqdm(iterable, leave=False, disable=None, **kw)


@dataclass
class DemoData:
    name: str
    backbone: str
    inputs: list[Any]  # per train sample: what goes into the request's "input"
    y_train: np.ndarray
    F_test: np.ndarray  # raw test features through the same backbone
    y_test: np.ndarray
    serve_inputs: dict[str, Any] = field(default_factory=dict)  # a few test inputs for `unlearn serve`


def _png(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def load_demo_data(dataset: str, n_train: int, n_test: int) -> DemoData:
    """Train inputs as request payloads; test features from the on-disk feature cache. Falls back
    to sklearn digits when Fashion-MNIST is not available offline."""
    from unlearn.services.demo.datasets import DatasetUnavailableError

    if dataset == "fashion":
        try:
            return _fashion_data(n_train, n_test)
        except DatasetUnavailableError as exc:
            print(f"note: {exc}\nnote: falling back to sklearn digits (pixels as features)", file=sys.stderr)
            dataset = "digits"
    if dataset == "tweets":
        return _tweets_data(n_train, n_test)
    return _digits_data(n_train, n_test)


def _fashion_data(n_train: int, n_test: int) -> DemoData:
    """PNG images through efficientnet-lite0 (in the featurizer)."""
    from unlearn.services.demo.datasets import cached_features, load_fashion_mnist

    X, y = load_fashion_mnist("train", limit=n_train)
    F_test, y_test = cached_features("fashion-mnist", "efficientnet-lite0", "test", n_test)
    Xt, _ = load_fashion_mnist("test", limit=SERVE_PROBES)
    probes = {"image_png": [base64.b64encode(_png(x)).decode() for x in Xt]}
    return DemoData("fashion-mnist", "efficientnet-lite0", [ImageInput(_png(x)) for x in X], y, F_test, y_test,
                    probes)


def _tweets_data(n_train: int, n_test: int) -> DemoData:
    """Texts through minilm (in the featurizer)."""
    from unlearn.services.demo.datasets import cached_features, load_tweets

    T, y = load_tweets("train", limit=n_train)
    F_test, y_test = cached_features("tweets", "minilm", "test", n_test)
    Tt, _ = load_tweets("test", limit=SERVE_PROBES)
    return DemoData("tweets", "minilm", [TextInput(str(t)) for t in T], y, F_test, y_test,
                    {"text": [str(t) for t in Tt]})


def _digits_data(n_train: int, n_test: int) -> DemoData:
    """Pixels as features (passthrough backbone: bit-reproducible, fast, always offline)."""
    from unlearn.services.demo.datasets import load_digits

    X, y = load_digits("train")
    Xt, yt = load_digits("test")
    X, y = X[:n_train], y[:n_train]
    return DemoData("digits", "features", [FeaturesInput(tuple(map(float, x))) for x in X], y, Xt[:n_test],
                    yt[:n_test], {"features": Xt[:SERVE_PROBES].tolist()})


class ReceiptWatcher:
    """Collects receipt arrival times. Started (offsets fixed at the topic's end) before any delete
    is produced, so every receipt of the run is seen."""

    def __init__(self, settings: Settings) -> None:
        self.arrived: dict[str, tuple[float, dict[str, Any]]] = {}
        self._follower = TopicFollower(settings, settings.topic("receipts"), self._on_record, start_at="end",
                                       role="demo-receipts")

    def start(self, timeout: float = 30.0) -> ReceiptWatcher:
        """Returns once partitions are assigned (``TopicReadError`` if not within ``timeout``)."""
        self._follower.start(wait_assigned=timeout)
        return self

    def stop(self) -> None:
        """Stop reading and close the consumer (before the broker stops)."""
        self._follower.stop()

    def _on_record(self, record: LogRecord) -> None:
        if record.value is None:
            return
        try:
            r = decode_receipt(record.value)
        except CodecError:
            return  # not a receipt the demo can time; the pipeline's own tests judge the format
        self.arrived[r.event_id] = (time.time(), {"status": r.status, "version": r.head_version, "reason": r.reason})


class Demo:
    """One run of the demo: ``run()`` owns the broker, the services and every in-process client;
    the phases (``_scenarios``) produce requests and wait on the heads and receipts they cause."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.head = args.head
        self.phases: list[Phase] = []
        self.produce_times: dict[str, float] = {}
        self.pending_receipts: list[str] = []
        self.seq = 0
        self.signers: dict[str, Signer] = {}  # client id -> its key, in signed mode
        self.sealed = 0  # adds sealed for transit (docs/erasure.md section 5)

    def request(self, op: str, i: int, client: str) -> Request:
        """The ``op`` request of train sample ``i`` (subject ``user<i mod subjects>``)."""
        self.seq += 1
        subject = f"user{i % self.args.subjects}"
        if op == "add":
            return Request(f"ev{self.seq}", "add", self.head, client, subject, f"sample{i}",
                           int(self.data.y_train[i]), self.data.inputs[i], time.time())
        return Request(f"ev{self.seq}", "delete", self.head, client, subject, f"sample{i}", ts=time.time())

    def produce(self, req: Request, key: bytes) -> None:
        """Produce one request, sealed for transit like the SDK does (UNLEARN_TRANSIT_SEAL) and
        signed by its client's key in signed mode."""
        req = seal_for_transit(req, self.transit, ClientSettings.of(self.settings).transit_seal)
        self.sealed += isinstance(req.input, SealedInput)
        value = encode_request(req)
        signer = self.signers.get(req.client_id)
        self.producer.produce(self.settings.topic("requests"), key=key, value=value,
                              headers=signer.headers(value) if signer is not None else None)

    def send(self, op: str, idx: list[int], desc: str) -> list[str]:
        """Produce ``op`` for each sample in ``idx`` (sample i belongs to client i mod clients, so in
        signed mode each client deletes only its own samples); their event ids."""
        events = []
        for i in _bar(idx, desc=desc, unit="ev") if desc else idx:
            req = self.request(op, int(i), f"client{int(i) % self.args.clients}")
            self.produce(req, req.subject_id.encode())
            self.produce_times[req.event_id] = time.time()
            events.append(req.event_id)
            self.producer.poll(0)
        self.producer.flush(60)
        return events

    def wait_retained(self, n: int, desc: str, timeout: float) -> HeadUpdate:
        """Wait until the head retains ``n`` samples and every pending receipt arrived."""
        with _bar(total=n, desc=desc, unit="samples") as bar:

            def reached(_remaining: float) -> HeadUpdate | None:
                h = self.heads.get(self.head)
                if h is not None:
                    bar.n = min(h.n_retained, n) if n else 0
                    bar.refresh()
                    if h.n_retained == n and all(e in self.receipts.arrived for e in self.pending_receipts):
                        return h
                return None

            return poll_until(reached, timeout, interval=0.1, timed_out=lambda: TimeoutError(
                self._stuck_message(n, timeout, self.heads.get(self.head))))

    def _stuck_message(self, n: int, timeout: float, h: HeadUpdate | None) -> str:
        logs = "\n".join(f"--- {p.name}\n{p.log_tail(15)}" for p in self.procs)
        reader = f"; heads reader: {self.heads.error}" if self.heads.error else ""
        return (f"head {self.head!r} did not reach n_retained={n} in {timeout}s "
                f"(last: {None if h is None else h.n_retained}){reader}\n{logs}")

    def exact_head(self, n: int) -> HeadUpdate:
        """The head's exact update once it retains ``n`` samples: only exact updates carry the
        ledger digest (the timer resets a fast head within UNLEARN_RESET_EVERY_SECONDS)."""
        return self.heads.wait(self.head, lambda u: u.n_retained == n and u.mode == "exact", self.args.timeout)

    def accuracy(self, h: HeadUpdate) -> float:
        """Test accuracy of the head's weights on the (quantized, normalized) test features."""
        q = Quantizer(HeadSettings.of(self.settings).frac_bits)
        F = q.dequantize(q.quantize(l2_normalize(self.data.F_test)))
        # over the classes with retained samples only, as serving predicts (schemas/head_scores.py)
        return float(np.mean(score_rows(h, F).predicted == self.data.y_test))

    def record(self, name: str, events: int, t0: float, h: HeadUpdate, **extra: Any) -> None:
        p = Phase(name, events, time.time() - t0, h.n_retained, self.accuracy(h), h.digest, h.version, extra)
        self.phases.append(p)
        tqdm.write(f"  {name:<28} {events:>6} events  {p.seconds:7.1f} s  retained {p.n_retained:>6}  "
                   f"test acc {p.accuracy:.4f}  digest {(p.digest or '(fast head)')[:12]}")

    def run(self) -> int:
        a = self.args
        self.out.mkdir(parents=True, exist_ok=True)
        for name in RUN_DIRS:
            shutil.rmtree(self.out / name, ignore_errors=True)
        t_start = time.time()
        print(f"[1/6] loading {a.dataset} (train {a.n_train}, test {a.n_test}; test features cached on disk)")
        self.data = load_demo_data(a.dataset, a.n_train, a.n_test)
        t_broker = time.monotonic()
        with local_broker(a.engine, log_path=self.out / "broker.log") as broker:
            self.broker_start_s = time.monotonic() - t_broker
            with self._services(broker), watch_services(self.procs), self._clients():
                return self._scenarios(len(self.data.y_train), t_start)

    @contextmanager
    def _services(self, broker: LocalBroker | LocalKafka) -> Iterator[None]:
        """Topics, then the featurizer, ledger worker and serving as child processes (stopped on exit,
        while the broker is still up)."""
        self.settings = Settings.from_env(bootstrap=broker.bootstrap, topic_prefix="demo.",
                                          data_dir=str(self.out / "state"), profile=self.args.engine,
                                          serve_port=free_port(), auth_mode="signed" if self.args.signed else None)
        create_topics(self.settings)
        if self.settings.auth_mode == "signed":
            from unlearn.services.demo.signing import register_demo_clients

            ids = ["demo", *(f"client{k}" for k in range(self.args.clients))]
            self.signers = register_demo_clients(self.settings, self.out / "keys", ids)
            print(f"      signed requests: {len(ids)} clients registered, keys in {self.out / 'keys'}")
        print(f"[2/6] {describe_engine(self.args.engine)} broker at {broker.bootstrap} (up in "
              f"{self.broker_start_s:.1f} s); starting featurizer, ledger worker and serving "
              f"(http://127.0.0.1:{ServeSettings.of(self.settings).serve_port})")
        print(f"      their state: {self.out / 'state'} (new, like the broker); their logs: {self.out / 'logs'}")
        self.procs = [ServiceProcess(name, [name], self.settings, self.out / "logs") for name in SERVICES]
        try:
            for p in self.procs:
                p.start()
            yield
        finally:
            for p in self.procs:
                p.stop()

    @contextmanager
    def _clients(self) -> Iterator[None]:
        """The demo's own Kafka clients: the receipt watcher and the heads follower (both reading
        before the first request is produced) and the request producer. All are closed on exit,
        before the services and the broker stop, so no client is left reconnecting to a gone broker."""
        self.receipts = ReceiptWatcher(self.settings)
        self.heads = HeadFollower(self.settings, [self.head, WARMUP_HEAD])
        self.producer = clients.producer(self.settings, **transit_producer_overrides(self.settings))
        sealing = ClientSettings.of(self.settings).transit_seal != "off"
        self.transit = TransitKeyCache(self.settings) if sealing else None
        try:
            self.receipts.start(30)
            self.heads.start(30)
            if self.transit is not None and self.transit.wait_for(self.head, 60) is None:  # published on assignment
                print("      note: no transit key published yet: adds wait for one (UNLEARN_TRANSIT_WAIT_SECONDS), "
                      "then fail", file=sys.stderr)
            yield
        finally:
            if self.transit is not None:
                self.transit.close()
            self.receipts.stop()
            self.heads.stop()
            self.producer.flush(10)
            self.producer.close()

    def _scenarios(self, n: int, t_start: float) -> int:
        """The paper's scenarios in order, then the checks and the report; the exit code."""
        self._warm_up()
        self._initial_adds(n)
        retained, before_burst = self._chunked_deletes(n)
        lat, h = self._burst_and_readd(retained)
        exact_return = h.digest == before_burst
        print("[6/6] replay verifier and a served prediction")
        cert = self.verify()
        served = self.serve_check(h)
        report = self.report(n, lat, exact_return, cert, t_start, served)
        return 0 if report["ok"] else 1

    def _warm_up(self) -> None:
        """One add on a separate head: the timed phases start once both workers have joined their
        consumer groups (a join takes seconds on tansu), so throughput measures the pipeline."""
        warm = Request("warmup", "add", WARMUP_HEAD, "demo", "warmup", "w0", 0, FeaturesInput((1.0, 0.0)), time.time())
        self.produce(warm, b"warmup")
        self.producer.flush(30)
        with _bar(desc="waiting for the workers to join", bar_format="{desc} {elapsed}"):
            self.heads.wait(WARMUP_HEAD, lambda u: True, timeout=self.args.timeout)

    def _initial_adds(self, n: int) -> None:
        print(f"[3/6] streaming {n} add events from {self.args.clients} clients through {self.data.backbone}")
        t0 = time.time()
        self.send("add", list(range(n)), "add")
        h = self.wait_retained(n, "ledger", self.args.timeout)
        self.record("initial adds", n, t0, h, events_per_s=n / (time.time() - t0))

    def _chunked_deletes(self, n: int) -> tuple[list[int], str]:
        """Delete 20% of the data per step, in a random order; what is retained, and the digest."""
        print("[4/6] chunked deletions: 20% of the data per step")
        retained = [int(i) for i in np.random.default_rng(0).permutation(n)]
        chunk = n // 5
        h = self.heads.get(self.head)
        for step in range(self.args.chunk_steps):
            gone, retained = retained[:chunk], retained[chunk:]
            t0 = time.time()
            self.pending_receipts = self.send("delete", gone, f"delete step {step + 1}")
            h = self.wait_retained(len(retained), f"delete step {step + 1}", self.args.timeout)
            self.record(f"chunk delete {step + 1} (-20%)", len(gone), t0, h)
        assert h is not None  # the initial adds published it
        digest = self.exact_head(len(retained)).digest
        assert digest is not None  # exact updates carry it
        return retained, digest

    def _burst_and_readd(self, retained: list[int]) -> tuple[np.ndarray, HeadUpdate]:
        """Single-sample deletions one by one (delete-to-receipt latency), then re-adding them.
        The latencies (ms) and the final head."""
        a = self.args
        burst = retained[:a.burst]
        print(f"[5/6] burst of {len(burst)} single-sample deletions, then re-adding them")
        t0 = time.time()
        self.pending_receipts = []
        for i in _bar(burst, desc="burst deletes", unit="ev"):
            self.pending_receipts += self.send("delete", [i], "")
            time.sleep(a.burst_gap_ms / 1000.0)
        h = self.wait_retained(len(retained) - len(burst), "burst", a.timeout)
        lat = np.array([self.receipts.arrived[e][0] - self.produce_times[e] for e in self.pending_receipts]) * 1000
        self.record(f"burst {len(burst)} single deletes", len(burst), t0, h,
                    latency_ms_p50=float(np.percentile(lat, 50)), latency_ms_p99=float(np.percentile(lat, 99)))
        t0 = time.time()
        self.pending_receipts = []
        self.send("add", burst, "re-add")
        h = self.wait_retained(len(retained), "re-add", a.timeout)
        self.record(f"re-add {len(burst)}", len(burst), t0, h)
        return lat, self.exact_head(len(retained))

    def verify(self) -> dict[str, Any]:
        """The replay verifier's certificate of the demo head (JSON-ready; ``ok`` says if it passed)."""
        from unlearn.services.verifier import verify_head

        return verify_head(self.settings, self.head, orders=3, partitions=3)

    def serve_check(self, h: HeadUpdate) -> dict[str, Any]:
        """Ask `unlearn serve` for predictions on a few test inputs; they must come from the final
        head (same version and digest) and agree with the published weights."""
        url = f"http://127.0.0.1:{ServeSettings.of(self.settings).serve_port}/v1/heads/{self.head}/predict"
        got = served_predictions(url, self.data.serve_inputs, h.version)
        if "predictions" not in got:
            return {"ok": False, "error": f"no prediction from the final head: {got}"}
        q = Quantizer(HeadSettings.of(self.settings).frac_bits)
        k = len(got["predictions"])
        local = score_rows(h, q.dequantize(q.quantize(l2_normalize(self.data.F_test[:k])))).predicted
        served = np.array([p["predicted_class"] for p in got["predictions"]])
        return {"ok": bool(got["digest"] == h.digest), "version": got["version"], "digest": got["digest"],
                "mode": got["mode"], "agree_with_published_head": int((served == local).sum()), "probes": k,
                "mean_variance": float(np.mean([p.get("variance") or 0.0 for p in got["predictions"]]))}

    def report(self, n: int, lat: np.ndarray, exact_return: bool, cert: dict[str, Any], t_start: float,
               served: dict[str, Any]) -> dict[str, Any]:
        """Write report.json and phases.png, print the summary; the report (``ok`` = every check held)."""
        rep = build_report(dataset=self.data.name, backbone=self.data.backbone, n_train=n, n_test=len(self.data.y_test),
                           clients=self.args.clients, phases=self.phases, lat=lat, exact_return=exact_return,
                           cert=cert, served=served, sealed=self.sealed, wall_seconds=time.time() - t_start,
                           broker=describe_engine(self.args.engine), broker_start_s=self.broker_start_s)
        return write_report(self.out, rep, self.phases, len(lat))



def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """``unlearn demo``'s options (``--full`` sets the sizes)."""
    ap = argparse.ArgumentParser(prog="unlearn demo", description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", choices=("fashion", "tweets", "digits"), default="fashion")
    ap.add_argument("--full", action="store_true", help="the whole dataset (slow on CPU)")
    ap.add_argument("--n-train", type=int, default=2000)
    ap.add_argument("--n-test", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--signed", action="store_true",
                    help="UNLEARN_AUTH_MODE=signed: register one key per client and sign every request")
    ap.add_argument("--subjects", type=int, default=500, help="distinct subject ids (request keys)")
    ap.add_argument("--chunk-steps", type=int, default=3)
    ap.add_argument("--burst", type=int, default=200)
    ap.add_argument("--burst-gap-ms", type=float, default=100.0, help="pause between burst deletes (10/s)")
    ap.add_argument("--head", default="demo")
    ap.add_argument("--engine", choices=ENGINES, default=ENGINES[0],
                    help="the local broker: tansu (embedded, in memory; the default: docs/design.md, \"The "
                    "embedded broker\") or kafka (Apache Kafka, one KRaft node; needs `make kafka` and java 17+)")
    ap.add_argument("--out", default="demo-out")
    ap.add_argument("--timeout", type=float, default=300.0, help="per phase")
    args = ap.parse_args(argv)
    if args.full:
        args.n_train, args.n_test = 60_000, 10_000
        if args.engine == "tansu":  # measured: docs/design.md, "The embedded broker"
            print("note: tansu keeps every record in memory (~0.2 MiB per add here: ~10 GiB for --full); "
                  "--engine kafka (after `make kafka`) keeps them on disk", file=sys.stderr)
    return args


def demo_main(argv: list[str] | None = None) -> int:
    return run_demo(Demo(parse_args(argv)))


def run_demo(demo: Demo) -> int:
    """Run ``demo``; its exit code (1 with the reason on stderr when one of its services died)."""
    try:
        return demo.run()
    except ServiceDied as exc:
        print(f"\ndemo stopped: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted: services stopped", file=sys.stderr)
        return 130
