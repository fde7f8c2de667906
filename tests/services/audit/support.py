"""What the audit tests share: the pipeline run they audit, an HTTP GET, and the tables of a page."""

from __future__ import annotations

import base64
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from unlearn.infra.processes import ServiceProcess
from unlearn.infra.settings import Settings
from unlearn.schemas.receipts import Receipt

TOKEN = "t0ken-for-tests"
BASIC = "dpo:s3cret pass"
BAD_DELETE = "bad-delete-1"
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts" / "audit"


@dataclass
class Audited:
    """The pipeline run: alice added a1, a2 and a3 (refused: wrong dimension) to head ``ha`` and
    deleted a1 (receipt ``delete_a1``) and sent an invalid delete of a2 (``BAD_DELETE``: rejected);
    bob added b1, b2; bob's delete of b2 was sent while the
    featurizer was stopped (pending, event ``pending_b2``); carol added c1 and c2 and deleted both
    (receipts ``extra["carol"]``), then re-added c1 dated after its delete (retained again) and c2
    dated before its delete (refused: ``deleted_before_arrival``). The head retains a2, b1, b2, c1."""

    settings: Settings
    url: str
    audit: ServiceProcess
    delete_a1: Receipt
    pending_event: str
    log_dir: Path
    extra: dict[str, object] = field(default_factory=dict)


def get(url: str, auth: str | None = "bearer", timeout: float = 120.0) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of a GET with the test credential (``auth``: bearer, basic or None)."""
    req = urllib.request.Request(url)
    if auth == "bearer":
        req.add_header("Authorization", f"Bearer {TOKEN}")
    elif auth == "basic":
        req.add_header("Authorization", "Basic " + base64.b64encode(BASIC.encode()).decode())
    elif auth is not None:
        req.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


class _Tables(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._table: list[list[str]] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._table = self.tables.setdefault(dict(attrs).get("class") or "", [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            self._table[-1].append(re.sub(r"\s+", " ", "".join(self._cell)).strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def tables(html: str) -> dict[str, list[list[str]]]:
    """Table class -> rows of cell texts (header row first; tables of one class are concatenated)."""
    p = _Tables()
    p.feed(html)
    return p.tables


def rows_by_first(rows: list[list[str]]) -> dict[str, list[str]]:
    return {r[0]: r for r in rows[1:] if r}


def head_with_certificate(url: str, head: str, version: int, timeout: float = 180.0) -> str:
    """The head page once it shows the certificate of ``version``; meanwhile each answer is quick
    and says a certificate is being computed (or waits its turn): the page never waits for the verifier."""
    deadline = time.monotonic() + timeout
    while True:
        html = get(f"{url}/heads/{head}")[2].decode()
        if f'id="cert-version">version {version} ' in html:
            return html
        # answered while the certificate is still being made: the page did not wait for the verifier
        assert 'id="cert-status" data-status="computing"' in html or 'data-status="waiting"' in html, html
        assert time.monotonic() < deadline, "no certificate"
        time.sleep(0.5)
