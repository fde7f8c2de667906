"""docs/operations.md, its alert rules and the sample Grafana dashboard name only metrics that
the processes export: the featurizer's and the ledger's (built as their commands build them)
and serving's, so a renamed metric cannot leave a dashboard or an alert silently empty."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from unlearn.infra.settings import Settings
from unlearn.services.serving.metrics import Metrics
from unlearn.services.serving.predict import HeadStore

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")


def _exported(registry: CollectorRegistry) -> set[str]:
    return {fam.name + suffix for fam in registry.collect() for suffix in SUFFIXES}


def test_every_metric_the_operations_doc_and_dashboard_name_is_exported() -> None:
    from unlearn.streams.featurizer.service import FeaturizerService
    from unlearn.streams.ledger.worker import LedgerWorker

    s = Settings.from_env(bootstrap="127.0.0.1:1", topic_prefix="t.ops.")  # nothing connects
    serving = Metrics()
    serving.watch(HeadStore(), None)
    ledger = LedgerWorker(s, "w0")
    try:
        exported = (_exported(FeaturizerService(s).metrics.registry) | _exported(ledger.metrics.registry)
                    | _exported(serving.registry))
    finally:
        ledger.consumer.close()
    doc = (ROOT / "docs" / "operations.md").read_text()
    dashboard = json.loads((ROOT / "docs" / "grafana" / "unlearn-stream.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    named = {m for m in re.findall(r"unlearn_[a-z0-9_]+", doc + " " + exprs) if not m.endswith("_")}
    assert named and named <= exported, sorted(named - exported)
    for family in ("consumer_lag", "events_total", "batch_duration_seconds_bucket", "checkpoint_age_seconds"):
        assert {f"unlearn_featurizer_{family}", f"unlearn_ledger_{family}"} <= exported
    assert "unlearn_ledger_delete_to_head_published_seconds_bucket" in named  # the dashboard shows it
