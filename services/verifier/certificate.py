"""The verifier's result: named checks and a certificate (``unlearn.verify/v1``) that prints as a
human summary or as JSON with an integrity hash (docs/verifier.md, "Certificate")."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from unlearn.schemas.head import HeadUpdate

CERTIFICATE_SCHEMA = "unlearn.verify/v1"

#: A check's outcome; "skipped" (not checkable) is not a failure.
Status = Literal["pass", "fail", "skipped"]


@dataclass
class Check:
    """One named check: its status, a human detail, and data for the JSON certificate."""

    name: str
    status: Status
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail, **self.data}


@dataclass
class Certificate:
    """Every check on one head, with the replay's and the live head's facts they were made on."""

    head_id: str
    source: dict[str, Any]
    checks: list[Check]
    replay: dict[str, Any]
    live_head: dict[str, Any] | None
    seed: int
    warnings: list[str] = field(default_factory=list)
    created_ts: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        """No check failed and at least one passed (all skipped certifies nothing)."""
        return all(c.status != "fail" for c in self.checks) and any(c.status == "pass" for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        """The JSON certificate; ``certificate_sha256`` hashes the canonical JSON of the rest."""
        body = {
            "schema": CERTIFICATE_SCHEMA,
            "head_id": self.head_id,
            "ok": self.ok,
            "created_ts": self.created_ts,
            "seed": self.seed,
            "source": self.source,
            "replay": self.replay,
            "live_head": self.live_head,
            "checks": [c.to_json() for c in self.checks],
            "warnings": self.warnings,
            "summary": self.summary_line(),
            "retrain_deviation": self.retrain_deviation,
        }
        body["certificate_sha256"] = hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
        return body

    @property
    def retrain_deviation(self) -> float | None:
        """The measured deviation from the scikit-learn retrain (None when not checked)."""
        for c in self.checks:
            if c.name == "retrain_deviation" and "deviation" in c.data:
                return float(c.data["deviation"])
        return None

    def summary_line(self) -> str:
        """One line: verdict, check counts, version and digest."""
        n = {s: sum(1 for c in self.checks if c.status == s) for s in ("pass", "fail", "skipped")}
        failed = [c.name for c in self.checks if c.status == "fail"]
        return (f"{'PASS' if self.ok else 'FAIL'}: {n['pass']} passed, {n['fail']} failed"
                + (f" ({', '.join(failed)})" if failed else "") + f", {n['skipped']} skipped; version "
                f"{self.replay.get('version')} digest {str(self.replay.get('digest'))[:16]}")

    def summary(self) -> str:
        """The human report ``unlearn verify`` prints."""
        r = self.replay
        lines = [f"verify head {self.head_id!r} ({_source_text(self.source)}): {'PASS' if self.ok else 'FAIL'}"]
        lines.append(
            f"  deltas: {r['messages']} messages for the head, {r['applied_versions']} applied (version "
            f"{r['version']}), {r['pending']} pending beyond the live head, skipped "
            f"{', '.join(f'{k}={v}' for k, v in sorted(r['skipped_counts'].items())) or 'none'}, "
            f"{len(r['rejected_entries'])} entries rejected")
        if r.get("digest"):
            lines.append(f"  replay: digest {r['digest']}  n_retained {r['n_retained']}  d {r['d']}  c {r['c']}  "
                         f"units {r['units']}")
        if self.live_head:
            h = self.live_head
            lines.append(f"  live head: version {h['version']} {h['mode']}  digest {h['digest']}  "
                         f"n_retained {h['n_retained']}")
        for c in self.checks:
            lines.append(f"  [{c.status:7}] {c.name}: {c.detail}")
        for rej in r["rejected_entries"][:10]:
            lines.append(f"  rejected entry: partition {rej['partition']} offset {rej['offset']} entry "
                         f"{rej['entry_index']} ({rej['op']}, {rej['events']} events): "
                         f"{rej['reason']}: {rej['detail']}")
        for w in self.warnings:
            lines.append(f"  warning: {w}")
        return "\n".join(lines)


def _source_text(src: dict[str, Any]) -> str:
    if src.get("kind") == "file":
        return f"file {src.get('path')}"
    if src.get("kind") == "broker":
        return f"broker {src.get('bootstrap')}, topic {src.get('deltas_topic')}"
    return "records given in memory"


def head_json(u: HeadUpdate) -> dict[str, Any]:
    """The certificate's ``live_head`` section: the update's facts, without its arrays."""
    return {"version": u.version, "mode": u.mode, "digest": u.digest, "n_retained": u.n_retained,
            "events_covered": u.events_covered, "offsets": [[p, o] for p, o in u.offsets], "gamma": u.gamma,
            "d": u.d, "c": u.c, "has_posterior": u.posterior is not None, "created_ts": u.created_ts}
