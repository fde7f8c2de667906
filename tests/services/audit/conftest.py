"""The pipeline run the audit tests look at (one per module: a real featurizer, ledger and
``unlearn audit`` on the session broker), built once because it takes a while."""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from tests.conftest import BrokerTarget
from tests.services.audit.support import BASIC, TOKEN, Audited, get
from tests.test_pipeline import pipeline_settings, services
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.services.client.head_reader import wait_for_head
from unlearn.services.client.sdk import UnlearnClient


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
    from unlearn.infra.topics import create_topics, delete_topics, prefixed_topics

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
            feat.stop()  # a delete nobody takes yet: the index shows it waiting
            pending = c.delete("ha", "b2", "bob")
            pending.wait_delivered(30)
        audit = ServiceProcess("audit", ["audit"], s, tmp / "logs").start()
        yield Audited(s, _wait_url(audit), audit, receipt, pending.event_id, tmp / "logs")
    finally:
        for p in (audit, feat, led):
            if p is not None:
                p.stop()
        with contextlib.suppress(Exception):
            delete_topics(base, prefixed_topics(base))
