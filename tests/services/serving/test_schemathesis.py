"""The HTTP contract is the document: schemathesis (pinned) generates requests for every route of
``openapi.json`` and validates every response against it, on a live ``unlearn serve`` process
following a head that a real ledger worker published from deltas of a declared contract (six
classes; classes 0, 1, 3 added, then every sample of class 3 deleted).

Stateful where it helps: the head is declared and created first, and half the cases name it, so
predictions, summaries and weights of a real head are checked, not only 404s. Requests are
generated from the schema (positive) and against it (negative: ``weights=AAA``, ``top_k=0``, bodies
that break the schema), which must be refused with a 4xx. Left out: schemathesis's
``positive_data_acceptance``, which expects every schema-valid request to succeed; a predict body
of the wrong width is schema-valid and rightly refused (400 ``dimension_mismatch``: a static
document cannot know a head's d).
"""

from __future__ import annotations

import socket
import time
import urllib.error
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.services.serving.support import http
from unlearn.common.registry import publish_contract
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.ledger import Quantizer, l2_normalize
from unlearn.schemas.delta_codec import Delta, RowsEntry, encode_delta
from unlearn.schemas.head_contract import HeadContract
from unlearn.services.serving.openapi import openapi_spec
from unlearn.services.serving.predict import MAX_TOP_K

HEAD = "st-head"
D, C = 2, 6
#: Generated cases: enough to reach every route and status in a few seconds on 2 cores.
CASES = 150


def _rows(tag: str, labels: list[int], seed: int, sign: int = 1) -> RowsEntry:
    Q = Quantizer().quantize(l2_normalize(np.random.default_rng(seed).normal(size=(len(labels), D))))
    ids = [f"{tag}{i}" for i in range(len(labels))]
    return RowsEntry(sign, [f"ev-{i}" for i in ids], ids, ["u"] * len(ids), np.array(labels, np.int64), Q)


def _publish_real_head(s: Settings) -> None:
    """Declare the head, then produce its deltas as a featurizer would (naming the contract)."""
    from confluent_kafka import Producer

    from unlearn.runtime.clients import producer_config

    publish_contract(s, HeadContract(head_id=HEAD, version=1, dimension=D, backbone="features",
                                     input_kind="features", normalization="l2", feature_bound=1.0, frac_bits=30,
                                     label_frac_bits=0, label_kind="class", gamma=1.0, n_classes=C))
    adds = _rows("a", [0, 1, 3, 0, 1, 3, 1], seed=1)
    threes = [i for i, y in enumerate(adds.labels.tolist()) if y == 3]
    gone = RowsEntry(-1, [f"del-{i}" for i in threes], [adds.sample_ids[i] for i in threes], ["u"] * len(threes),
                     adds.labels[threes], adds.q[threes])
    p = Producer(producer_config(s, **{"linger.ms": 0}))
    for n, entry in enumerate((adds, gone)):
        delta = Delta(HEAD, f"requests/0@{n}", D, 30, 0, (entry,), C, 1)
        p.produce(s.topic("deltas"), key=HEAD.encode(), value=encode_delta(delta))
    assert p.flush(30) == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_served(url: str, proc: ServiceProcess, timeout: float = 60.0) -> dict:
    """The head's summary once serving shows version 2 (the delete) as an exact head."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            status, last = http("GET", f"{url}/v1/heads/{HEAD}", timeout=2)
            if status == 200 and isinstance(last, dict) and last["version"] >= 2 and last["mode"] == "exact":
                return last
        except (urllib.error.URLError, ConnectionError):
            pass
        assert proc.alive, proc.log_tail()
        time.sleep(0.1)
    raise AssertionError(f"serving never showed {HEAD} version 2 exact: {last}\n{proc.log_tail()}")


@pytest.fixture
def live_serving(settings: Settings, tmp_path: Path) -> str:
    s = settings.with_(data_dir=str(tmp_path / "data"), reset_every_seconds=0.5)
    _publish_real_head(s)
    port = _free_port()
    ledger = ServiceProcess("ledger", ["ledger", "--worker-id", "w0", "--loglevel", "info"], s, tmp_path).start()
    serve = ServiceProcess("serve", ["serve", "--port", str(port), "--loglevel", "info"], s, tmp_path).start()
    try:
        url = f"http://127.0.0.1:{port}"
        summary = _wait_served(url, serve)
        assert summary["retained_classes"] == [0, 1] and summary["c"] == C and summary["drift"] == 0.0
        yield url
    finally:
        assert serve.stop() == 0, serve.log_tail()
        ledger.stop()


def test_every_response_of_every_route_validates_against_the_document(live_serving: str) -> None:
    url = live_serving
    schema = schemathesis.openapi.from_dict(openapi_spec())
    operations = [r.ok() for r in schema.get_all_operations()]
    strategies = []
    for op in operations:
        strategies.append(op.as_strategy())
        if "{head}" in op.path:  # the real head: predictions, summaries and weights, not only 404s
            strategies.append(op.as_strategy(path_parameters={"head": HEAD}))
        if op.query or op.body:  # a body or a query to break
            pinned = {"path_parameters": {"head": HEAD}} if "{head}" in op.path else {}
            strategies.append(op.as_strategy(GenerationMode.NEGATIVE, **pinned))
    seen: Counter[tuple[str, int]] = Counter()

    def call(case: schemathesis.Case) -> None:
        response = case.call_and_validate(base_url=url, excluded_checks=[positive_data_acceptance], timeout=10)
        seen[(case.operation.label, response.status_code)] += 1

    # Every strategy gets its share of the cases: one draw from a one_of over all of them left
    # whole routes (/healthz) untried once the /v2 routes came.
    for strategy in strategies:
        settings(max_examples=max(3, CASES // len(strategies)), deadline=None, database=None, derandomize=True,
                 suppress_health_check=list(HealthCheck))(given(case=strategy)(call))()
    # the run reached the real head and refused what breaks the document
    assert seen[("GET /v1/heads/{head}", 200)] and seen[("GET /healthz", 200)], seen
    assert seen[("POST /v1/heads/{head}/predict", 200)] or seen[("POST /v1/heads/{head}/predict", 400)], seen
    # the Open Inference Protocol routes on the real head, at its served version, asked explicitly
    # (generated cases mostly name unknown heads and versions): their answers validate too
    version = str(http("GET", f"{url}/v1/heads/{HEAD}")[1]["version"])
    h, at = {"head": HEAD}, {"head": HEAD, "version": version}
    binary = {"parameters": {"binary_data_output": True}}
    rows = {"inputs": [{"name": "features", "shape": [2, D], "datatype": "FP32", "data": [0.6, 0.8, 1.0, 0.0]}]}
    for label, params, body, want in (
            ("GET /v2", {}, None, 200), ("GET /v2/health/live", {}, None, 200),
            ("GET /v2/health/ready", {}, None, 200), ("GET /v2/models/{head}", h, None, 200),
            ("GET /v2/models/{head}/versions/{version}", at, None, 200),
            ("GET /v2/models/{head}/ready", h, None, 200),
            ("GET /v2/models/{head}/versions/{version}/ready", {**at, "version": "0"}, None, 404),
            ("POST /v2/models/{head}/infer", h, rows, 200),
            ("POST /v2/models/{head}/versions/{version}/infer", at, {**rows, **binary}, 200),
            ("POST /v2/models/{head}/versions/{version}/infer", {**at, "version": "0"}, rows, 404)):
        op = schema.find_operation_by_label(label)
        assert op is not None, label
        case = op.Case(path_parameters=params or None, **({"body": body} if body is not None else {}))
        response = case.call_and_validate(base_url=url, excluded_checks=[positive_data_acceptance], timeout=10)
        assert response.status_code == want, (label, response.status_code, response.text[:300])


def test_invalid_query_values_are_refused_and_predictions_skip_classes_without_samples(live_serving: str) -> None:
    url = live_serving
    assert http("GET", f"{url}/v1/heads/{HEAD}?weights=AAA")[0] == 400
    status, out = http("GET", f"{url}/v1/heads/{HEAD}?weights=1")
    assert status == 200 and len(out["weights"]) == D and len(out["weights"][0]) == C
    assert http("GET", f"{url}/v1/heads/{HEAD}?weights=1&weights=1")[0] == 400
    assert http("GET", f"{url}/v1/heads?x=1")[0] == 400
    for bad in ("0", "-1", "x", str(MAX_TOP_K + 1), "1.5", "1" * 5000, "\u0661"):  # U+0661: a non-ASCII digit
        status, err = http("POST", f"{url}/v1/heads/{HEAD}/predict?top_k={quote(bad)}", {"features": [1.0, 0.0]})
        assert (status, err["error"]) == (400, "bad_query"), bad
    status, health = http("GET", f"{url}/healthz")
    assert status == 200 and isinstance(health["consumer"]["topic"], str) and "heads" in health["consumer"]["topic"]
    inputs = np.random.default_rng(7).normal(size=(50, D)).tolist()
    status, out = http("POST", f"{url}/v1/heads/{HEAD}/predict?top_k=5", {"features": inputs})
    assert status == 200 and out["retained_classes"] == [0, 1]
    for p in out["predictions"]:
        assert p["predicted_class"] in (0, 1) and p["top_classes"] == sorted([0, 1], key=lambda j: -p["scores"][j])
        assert [j for j, v in enumerate(p["scores"]) if v is not None] == [0, 1]
