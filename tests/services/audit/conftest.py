"""The pipeline run the audit tests look at (one per module: a real featurizer, ledger and
``unlearn audit`` on the session broker), built once because it takes a while."""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Iterator

import numpy as np
import orjson
import pytest

from tests.conftest import BrokerTarget
from tests.services.audit.support import BAD_DELETE, BASIC, TOKEN, Audited, get
from tests.test_pipeline import pipeline_settings, produce, services
from unlearn.infra.polling import poll_until
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.runtime.topic_reader import read_topic
from unlearn.services.audit.views import subject_refusals
from unlearn.services.client.head_reader import wait_for_head
from unlearn.services.client.sdk import UnlearnClient
from unlearn.services.verifier.reading import decode_receipts


def _wait_url(proc: ServiceProcess, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"unlearn audit ready url='([^']+)'", proc.log_path.read_text(errors="replace"))
        if m and get(m.group(1) + "/healthz", auth=None, timeout=5)[0] == 200:
            return m.group(1)
        assert proc.alive, proc.log_tail()
        time.sleep(0.2)
    raise AssertionError(f"audit never ready: {proc.log_tail()}")


@pytest.fixture(scope="module")
def audited(broker_target: BrokerTarget, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Audited]:
    from unlearn.runtime.topics import create_topics, delete_topics, prefixed_topics

    tmp = tmp_path_factory.mktemp("audit")
    base = Settings.from_env(bootstrap=broker_target.bootstrap, profile=broker_target.profile,
                             topic_prefix=f"t.audit.{uuid.uuid4().hex[:8]}.")
    create_topics(base)
    s = pipeline_settings(base, tmp).with_(transit_seal="off", audit_token=TOKEN, audit_basic=BASIC, audit_port=0)
    feat, led = services(s, tmp)
    audit = None
    try:
        rng = np.random.default_rng(3)
        with UnlearnClient(s, client_id="audit-test") as c:
            for subject, sample in (("alice", "a1"), ("alice", "a2"), ("bob", "b1"), ("bob", "b2")):
                c.add("ha", subject, sample, int(rng.integers(0, 2)), features=rng.normal(size=4)).wait_delivered(30)
            first = wait_for_head(s, "ha", lambda u: u.n_retained == 4, timeout=120)  # a version before the delete
            c.add("ha", "alice", "a3", 0, features=rng.normal(size=5)).wait_delivered(30)  # refused: dimension
            receipt = c.delete("ha", "a1", "alice").wait_receipt(120)
            assert receipt.status == "applied", receipt
            wait_for_head(s, "ha", lambda u: u.mode == "exact" and u.n_retained == 3
                          and u.version >= (receipt.head_version or 0) > first.version, timeout=120)
            # a refused delete (invalid ts): a dead letter and a rejected receipt, and a2 stays
            produce(s, [(b"alice", orjson.dumps({"schema": "unlearn.request/v1", "event_id": BAD_DELETE, "op": "delete",
                                                 "head_id": "ha", "client_id": "audit-test", "subject_id": "alice",
                                                 "sample_id": "a2", "ts": "soon"}))])
            poll_until(lambda _r: BAD_DELETE in {r.event_id for r in decode_receipts(
                read_topic(s, s.topic("receipts"), timeout=30))} or None, 60, interval=0.5,
                       timed_out=lambda: AssertionError("no receipt of the invalid delete"))
            # carol: c1 added, deleted, re-added later in event time (retained again); c2 added,
            # deleted, and re-added dated before its delete (refused: deleted_before_arrival)
            t0 = time.time() - 20
            for sample in ("c1", "c2"):
                c.add("ha", "carol", sample, 1, features=rng.normal(size=4), ts=t0).wait_delivered(30)
            carol = {sample: c.delete("ha", sample, "carol", ts=t0 + 2).wait_receipt(120) for sample in ("c1", "c2")}
            assert all(rc.status == "applied" for rc in carol.values()), carol
            c.add("ha", "carol", "c1", 0, features=rng.normal(size=4), ts=t0 + 4).wait_delivered(30)
            c.add("ha", "carol", "c2", 0, features=rng.normal(size=4), ts=t0 + 1).wait_delivered(30)
            wait_for_head(s, "ha", lambda u: u.mode == "exact" and u.n_retained == 4, timeout=120)  # a2 b1 b2 c1
            poll_until(lambda _r: any(r.sample_id == "c2" and r.reason == "deleted_before_arrival"
                                      for r in subject_refusals(s, "carol", 30)) or None, 60, interval=0.5,
                       timed_out=lambda: AssertionError("the re-add of c2 dated before its delete was not refused"))
            feat.stop()  # a delete nobody takes yet: the index shows it waiting
            pending = c.delete("ha", "b2", "bob")
            pending.wait_delivered(30)
        audit = ServiceProcess("audit", ["audit"], s, tmp / "logs").start()
        yield Audited(s, _wait_url(audit), audit, receipt, pending.event_id, tmp / "logs", {"carol": carol})
    finally:
        for p in (audit, feat, led):
            if p is not None:
                p.stop()
        with contextlib.suppress(Exception):
            delete_topics(base, prefixed_topics(base))
