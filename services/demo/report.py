"""What ``unlearn demo`` reports: its phases, report.json, phases.png and the printed summary, and
serving's answer to the demo's probe inputs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from unlearn.infra.polling import poll_until


@dataclass
class Phase:
    name: str
    events: int
    seconds: float
    n_retained: int
    accuracy: float
    digest: str | None  # None when the phase ended on a fast head (fast updates carry no digest)
    version: int
    extra: dict[str, Any] = field(default_factory=dict)


def served_predictions(url: str, inputs: dict[str, Any], version: int, timeout: float = 60.0) -> dict[str, Any]:
    """Serving's answer at ``url`` (a predict endpoint) for ``inputs`` once it serves ``version`` or
    later (it follows ``heads`` on its own); after ``timeout`` seconds, its last answer without
    predictions (an older head's answer is no answer) or ``{"error": ...}``."""
    import urllib.error
    import urllib.request

    body = json.dumps(inputs).encode()
    last: dict[str, Any] = {}

    def answer(_remaining: float) -> dict[str, Any] | None:
        nonlocal last
        try:
            req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                last = json.loads(resp.read())
            if last.get("version", -1) >= version:
                return last
        except (urllib.error.URLError, OSError) as exc:
            last = {"error": str(exc)}
        return None

    try:
        return poll_until(answer, timeout, interval=1.0, timed_out=TimeoutError)
    except TimeoutError:
        last.pop("predictions", None)
        return last


def write_report(out: Path, rep: dict[str, Any], phases: list[Phase], n_burst: int) -> dict[str, Any]:
    """Write ``out``/report.json and ``out``/phases.png and print the summary; ``rep``."""
    (out / "report.json").write_text(json.dumps(rep, indent=2, default=str))
    plot(phases, rep["dataset"], out / "phases.png")
    print_summary(rep, phases, n_burst, out)
    return rep


def print_summary(rep: dict[str, Any], phases: list[Phase], n_burst: int, out: Path) -> None:
    cert, served, exact_return = rep["verifier"], rep["serving"], rep["readd_restores_digest"]
    print("\n== results ==")
    for p in phases:
        print(f"  {p.name:<28} test acc {p.accuracy:.4f}   {p.seconds:6.1f} s")
    print(f"  delete->receipt latency  p50 {rep['delete_to_receipt_ms']['p50']:.0f} ms   "
          f"p99 {rep['delete_to_receipt_ms']['p99']:.0f} ms   (burst of {n_burst})")
    print(f"  add throughput {rep['throughput_events_per_s']:.0f} events/s end to end (incl. the backbone)")
    dev = cert.get("retrain_deviation")
    print(f"  verifier: {'PASS' if cert.get('ok') else 'FAIL'} "
          f"({cert.get('summary', cert.get('error', ''))})")
    why = "" if exact_return or rep["backbone_bit_reproducible"] else (
        f" ({rep['backbone']} re-encoded the re-added inputs with last-bit differences (batch effects), so "
        "they are new samples to the ledger; their first q's were erased with the deletes)")
    print(f"  exactness: re-adding the burst restores the ledger digest bit for bit: {exact_return}{why}; "
          f"deviation from an independent retrain: {dev if dev is not None else 'n/a'}")
    if served.get("ok"):
        print(f"  serving: version {served['version']} ({served['mode']}), digest {served['digest'][:16]}: "
              f"{served['agree_with_published_head']}/{served['probes']} predictions agree with the published "
              f"head (mean predictive variance {served['mean_variance']:.3g})")
    else:
        print(f"  serving: FAIL ({served.get('error')})")
    print(f"  report: {out / 'report.json'}   plot: {out / 'phases.png'}   "
          f"total {rep['wall_seconds']:.0f} s")


def plot(phases: list[Phase], dataset: str, path: Path) -> None:
    """Test accuracy and cumulative wall time per phase, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [p.name for p in phases]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ax[0].plot(range(len(names)), [p.accuracy for p in phases], "o-")
    ax[0].set_title(f"test accuracy per phase ({dataset})")
    ax[1].plot(range(len(names)), np.cumsum([p.seconds for p in phases]), "s-", color="C1")
    ax[1].set_title("cumulative wall time (s)")
    for a_ in ax:
        a_.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        a_.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_report(*, dataset: str, backbone: str, n_train: int, n_test: int, clients: int, phases: list[Phase],
                 lat: np.ndarray, exact_return: bool, cert: dict[str, Any], served: dict[str, Any], sealed: int,
                 wall_seconds: float, broker: str, broker_start_s: float) -> dict[str, Any]:
    """The report of one run (``ok`` = every check held)."""
    # Re-adding restores the digest bit for bit only when the backbone is bit-reproducible:
    # a neural backbone's output for an input can differ in the last bits with the batch it is
    # encoded in, and a re-add is a new encoding (its old q was erased with the delete, as
    # erasure demands). The replay verifier certifies exactness in every case.
    reproducible = backbone == "features"
    ok = bool(cert.get("ok") and served.get("ok") and (exact_return or not reproducible))
    return {
        "dataset": dataset, "backbone": backbone, "n_train": n_train, "n_test": n_test, "clients": clients,
        "phases": [p.__dict__ for p in phases],
        "delete_to_receipt_ms": {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99))},
        "throughput_events_per_s": phases[0].extra.get("events_per_s"),
        "readd_restores_digest": exact_return, "backbone_bit_reproducible": reproducible,
        "verifier": cert, "serving": served, "ok": ok, "adds_sealed_for_transit": sealed,
        "wall_seconds": wall_seconds, "broker": broker, "broker_start_s": broker_start_s,
    }
