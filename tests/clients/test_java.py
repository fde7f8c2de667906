"""The Java client (clients/java) end to end on a real broker, against the Python pipeline.

A small Java program (clients/java/src/test/java/dev/unlearn/client/EndToEndMain.java) uses the
Java ``UnlearnClient`` to add samples -- signed with an Ed25519 key registered for its client id
(the featurizer runs in signed mode), sealed for transit under the key the featurizer publishes,
as JSON numbers, ``<f8`` and ``<f4`` -- then deletes one sample and one subject and waits for
their receipts, and predicts with its ``HeadFollower`` once an exact head excludes them. This
test starts the Python featurizer and ledger, runs the program, and checks every line it prints
against the reference: the receipts, the retained count, and serving's own predict on the same
head version (scores and variance to 1e-12, the same classes).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from unlearn.common.families import heads_family
from unlearn.common.registry import publish_client, read_contracts
from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.runtime.topic_reader import read_topic
from unlearn.schemas.binary_frame import CodecError
from unlearn.schemas.client_record import ClientKey, ClientRecord, key_fingerprint
from unlearn.schemas.head import HeadUpdate, decode_head
from unlearn.services.serving.predict import HeadStore, predict, prepare_inputs

pytestmark = pytest.mark.broker

JAVA = Path(__file__).resolve().parents[2] / "clients" / "java"
SEED = hashlib.sha256(b"java-e2e-client").digest()


def java_classpath(tmp_path: Path) -> str:
    """Compile the Java client and its test program; the classpath to run it (Maven, ~5 s warm)."""
    mvn, java = shutil.which("mvn"), shutil.which("java")
    assert mvn and java, "the Java client's test needs java 17+ and mvn on PATH (as `make kafka` does)"
    cp_file = tmp_path / "cp.txt"
    subprocess.run([mvn, "-q", "-B", "-f", str(JAVA / "pom.xml"), "test-compile", "dependency:build-classpath",
                    f"-Dmdep.outputFile={cp_file}"], check=True, timeout=600)
    return ":".join([str(JAVA / "target" / "classes"), str(JAVA / "target" / "test-classes"),
                     cp_file.read_text().strip()])


def exact_update(s: Settings, head: str, version: int) -> HeadUpdate:
    for rec in read_topic(s, heads_family(s.topic_prefix), timeout=30.0):
        try:
            u = decode_head(rec.value or b"")
        except CodecError:
            continue
        if u.head_id == head and u.version == version and u.mode == "exact":
            return u
    raise AssertionError(f"no exact update of {head!r} at version {version}")


def test_java_client_end_to_end(settings: Settings, tmp_path: Path) -> None:
    cp = java_classpath(tmp_path)
    s = settings.with_(data_dir=str(tmp_path / "data"), auth_mode="signed", checkpoint_every_messages=5,
                       checkpoint_every_seconds=1.0, reset_every_seconds=1.0, batch_max_ms=30)
    public = Ed25519PrivateKey.from_private_bytes(SEED).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    publish_client(s, ClientRecord("java-app", 1, (ClientKey(key_fingerprint(public), public),), ("*",),
                                   rate_per_second=0.0))
    feat = ServiceProcess("featurizer", ["featurizer"], s, tmp_path / "logs").start()
    led = ServiceProcess("ledger", ["ledger"], s, tmp_path / "logs").start()
    head = "jvm"
    try:
        run = subprocess.run(["java", "-cp", cp, "dev.unlearn.client.EndToEndMain", s.bootstrap, s.topic_prefix, head,
                              SEED.hex(), "java-app"], capture_output=True, text=True, timeout=400)
        assert run.returncode == 0, f"java failed:\n{run.stdout}\n{run.stderr[-4000:]}\n{feat.log_tail()}"
        lines: list[dict[str, Any]] = [orjson.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    finally:
        feat.stop()
        led.stop()
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_kind.setdefault(line["kind"], []).append(line)
    assert by_kind["adds"] == [{"kind": "adds", "n": 24, "sealed": 24}]
    (lonely,) = by_kind["auto_without_key"]  # AUTO with no key published: refused after its wait, not plaintext
    assert lonely["refused"] is True and lonely["waited_ms"] >= 1000
    one, subject, none = by_kind["receipt"]
    assert one["status"] == "applied" and one["sample_ids"] == ["s-3"]
    u1 = sorted(f"s-{i}" for i in range(24) if i % 4 == 1)
    assert subject["status"] == "applied" and sorted(subject["sample_ids"]) == u1
    assert none["status"] in ("tombstoned", "rejected"), none  # removed nothing, said so
    (h,) = by_kind["head"]
    assert h["mode"] == "exact" and int(h["n_retained"]) == 24 - 1 - len(u1)
    version = int(h["version"])
    assert version >= max(int(one["head_version"]), int(subject["head_version"]))
    update = exact_update(s, head, version)
    assert update.digest == h["digest"] and update.contract_version == h["contract_version"]
    store = HeadStore()
    store.offer(update)
    served = store.get(head)
    assert served is not None
    contract = read_contracts(s)[head]
    preds = by_kind["predict"]
    assert len(preds) == 5 and by_kind["done"][0]["bad_updates"] == 0
    for p in preds:
        X = prepare_inputs(s, served, "features", [np.asarray(p["features"], dtype=np.float64)], contract)
        want = predict(served, X, 1.0, 2)["predictions"][0]
        assert p["version"] == str(version)
        assert p["predicted_class"] == want["predicted_class"] and p["top_classes"] == want["top_classes"]
        for a, b in zip(p["scores"], want["scores"], strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                assert abs(a - b) <= 1e-12 * max(1.0, abs(b)), (a, b)
        assert want["variance"] is not None
        assert abs(p["variance"] - want["variance"]) <= 1e-12 * max(1.0, abs(want["variance"]))
