"""HTML of the audit pages: server-rendered, one stylesheet and one small script served by the
app itself (no CDN: the pages work offline), the history plot drawn as inline SVG.

Accessibility: ``lang``, a viewport for phones, a skip link, labelled form fields, tables with
captions and header scopes, a visible keyboard focus, text at >= 7:1 contrast, and the plot's
data repeated in a table (a screen reader cannot read a plot).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from html import escape
from urllib.parse import quote

import orjson

from unlearn.schemas.head import HeadUpdate

from .certificates import CertState
from .views import HeadView, IndexView, SubjectHead

__all__ = ["SCRIPT", "STYLE", "head_page", "index_page", "subject_page"]

STYLE = """
:root { color: #111; background: #fff; font: 16px/1.5 system-ui, sans-serif; }
body { margin: 0 auto; max-width: 70rem; padding: 0 1rem 2rem; }
a { color: #0645ad; } a:visited { color: #5a2a82; }
:focus-visible { outline: 3px solid #b35900; outline-offset: 2px; }
.skip { position: absolute; left: -999px; } .skip:focus { left: 1rem; top: 1rem; background: #fff; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
caption { text-align: left; font-weight: 600; padding: 0.25rem 0; }
th, td { border: 1px solid #767676; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top;
         overflow-wrap: anywhere; }
.scroll { overflow-x: auto; max-width: 100%; }
code, .mono { font-family: ui-monospace, monospace; word-break: break-all; }
.ok { color: #0b5d1e; font-weight: 600; } .bad { color: #a00000; font-weight: 600; }
input, button { font: inherit; padding: 0.3rem; } svg { max-width: 100%; height: auto; }
pre { white-space: pre-wrap; word-break: break-all; background: #f3f3f3; padding: 0.5rem; }
@media (max-width: 40rem) {
  .cards table, .cards caption, .cards tbody, .cards tr, .cards th, .cards td { display: block; }
  .cards thead { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); }
  .cards tbody tr { border: 1px solid #767676; margin-bottom: 0.5rem; }
  .cards th, .cards td { border: none; border-top: 1px solid #d0d0d0; }
  .cards tbody [data-label]::before { content: attr(data-label) ": "; font-weight: 600; }
  .cards td:empty { display: none; }
}
"""

SCRIPT = """
// Ages of pending deletes tick while the page is open; the server rendered them once.
function fmtAge(s) {
  s = Math.max(0, Math.floor(s));
  var d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  return (d ? d + "d " : "") + (d || h ? h + "h " : "") + m + "m " + (s % 60) + "s";
}
function tick() {
  var now = Date.now() / 1000;
  document.querySelectorAll("[data-since]").forEach(function (el) {
    el.textContent = fmtAge(now - parseFloat(el.getAttribute("data-since")));
  });
}
tick();
setInterval(tick, 1000);
document.documentElement.setAttribute("data-ready", "1");
"""


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{escape(title)} · unlearn audit</title><link rel="stylesheet" href="/static/audit.css">'
            f'<script src="/static/audit.js" defer></script></head><body>'
            f'<a class="skip" href="#main">Skip to content</a>'
            f'<header><nav aria-label="site"><a href="/">All heads</a></nav></header>'
            f'<main id="main"><h1>{escape(title)}</h1>{body}</main></body></html>')


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _when(ts: float | None) -> str:
    if not ts:
        return ""
    iso = _iso(ts)
    return f'<time datetime="{iso}">{iso}</time>'


def _table(caption: str, head: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """A table of pre-escaped cells (the first of each row a row header). On a phone each row
    becomes a card of "header: value" lines (``data-label``); the explicit ARIA roles keep the
    table's semantics when CSS changes its display."""
    labels = [escape(h) for h in head]
    ths = "".join(f"<th scope='col' role='columnheader'>{h}</th>" for h in labels)
    body = "".join("<tr role='row'>" + "".join(
        f"<th scope='row' role='rowheader' data-label='{labels[i]}'>{c}</th>" if i == 0
        else f"<td role='cell' data-label='{labels[i]}'>{c}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows)
    return (f"<div class='scroll cards'><table class='{cls}' role='table'><caption>{escape(caption)}</caption>"
            f"<thead role='rowgroup'><tr role='row'>{ths}</tr></thead><tbody role='rowgroup'>{body}</tbody>"
            "</table></div>")


def _head_link(head: str) -> str:
    return f'<a href="/heads/{quote(head, safe="")}">{escape(head)}</a>'


def _subject_link(subject: str) -> str:
    return f'<a href="/subjects/{quote(subject, safe="")}">{escape(subject)}</a>'


def index_page(v: IndexView) -> str:
    """The heads, and the deletes received but not yet answered by a receipt, with their age."""
    form = ('<form action="/subjects" method="get" aria-label="subject lookup"><label for="subject">Subject id</label> '
            '<input id="subject" name="id" required autocomplete="off"> <button type="submit">Show subject'
            '</button></form>')
    heads = _table("Heads (latest version of each)", ["head", "version", "mode", "samples retained", "digest",
                                                      "published"],
                   ([_head_link(h), str(u.version), u.mode, str(u.n_retained),
                     f'<span class="mono">{escape(u.digest or "(fast: none)")}</span>', _when(u.created_ts)]
                    for h, u in sorted(v.heads.items())), "heads")
    if v.pending:
        pending = _table(f"Deletes received, not yet applied ({len(v.pending)})",
                         ["event", "head", "subject", "request", "received", "age", "seen in"],
                         ([f'<span class="mono">{escape(p.event_id)}</span>', _head_link(p.head_id),
                           _subject_link(p.subject_id), escape(p.op + (f" {p.sample_id}" if p.sample_id else "")),
                           _when(p.received_ts), f'<span data-since="{p.received_ts}">{int(p.age(v.now))} s</span>',
                           escape(p.where)] for p in v.pending), "pending")
    else:
        pending = '<p id="no-pending">No delete is waiting: every delete received has a receipt.</p>'
    return _page("Unlearn audit", f"<section><h2>Find a subject</h2>{form}</section>"
                 f"<section><h2>Heads</h2>{heads}</section><section><h2>Pending deletes</h2>{pending}</section>")


def subject_page(subject_id: str, heads: list[SubjectHead]) -> str:
    """Per head: each sample's state (with its receipt or refusal), the receipts, the erasure checks."""
    if not heads:
        return _page(f"Subject {subject_id}", "<p>No head holds, held or refused data of this subject.</p>")
    return _page(f"Subject {subject_id}", "".join(_subject_head(subject_id, h) for h in heads))


def _subject_head(subject_id: str, h: SubjectHead) -> str:
    rows = []
    for s in h.samples:
        rc = s.receipt or {}
        state = {"retained": "retained", "deleted": "deleted", "refused": "refused",
                 "not retained": "not retained (no applied receipt names it yet)"}[s.state]
        if s.readded:
            state = "retained (re-added after its delete)"
        rows.append([f'<span class="mono">{escape(s.sample_id)}</span>', state, escape(rc.get("status", "")),
                     _when(rc.get("ts")), escape(str(rc.get("head_version") or "")),
                     f'<span class="mono">{escape(rc.get("retained_hash") or "")}</span>', escape(s.reason or "")])
    samples = _table(f"Samples in head {h.head_id} (state now; a re-added sample shows the delete it came "
                     "back after)", ["sample", "state", "receipt", "receipt time", "first version without it",
                                     "retained-rows hash", "refusal reason"], rows, "samples")
    receipts = _table(f"Delete receipts in head {h.head_id}", ["event", "status", "samples", "receipt time",
                                                                "head version", "reason"],
                      ([f'<span class="mono">{escape(rc["event_id"])}</span>', escape(rc["status"]),
                        escape(", ".join(rc["sample_ids"]) or "(none)"), _when(rc.get("ts")),
                        escape(str(rc["head_version"] or "")), escape(rc["reason"] or "")]
                       for rc in h.report.receipts), "receipts")
    rep = h.report
    verdict = '<span class="ok">CLEAR</span>' if rep.clear else '<span class="bad">NOT CLEAR</span>'
    checks = _table("Stores checked (erasure-report)", ["store", "clear", "detail"],
                    ([escape(c.store), '<span class="ok">yes</span>' if c.clear else '<span class="bad">no</span>',
                      escape(c.detail) + "".join(f"<br>{escape(p)}" for p in c.problems[:5])]
                     for c in rep.checks), "checks")
    kept = sum(s.state == "retained" for s in h.samples)
    excluded = f"none: {kept} retained now" if kept else str(rep.excluded_from_version)
    url = f"/subjects/{quote(subject_id, safe='')}/erasure-report.json?head={quote(h.head_id, safe='')}"
    return (f'<section aria-labelledby="h-{escape(h.head_id)}"><h2 id="h-{escape(h.head_id)}">Head '
            f"{_head_link(h.head_id)}</h2>{samples}{receipts}<h3>Erasure state: {verdict}</h3>"
            f"<p>Head version first excluding every sample: {escape(excluded)}</p>{checks}"
            f'<p><a href="{url}" download>Download the erasure report (JSON)</a></p></section>')


def head_page(v: HeadView, certificate: CertState | None, command: str) -> str:
    """History plot and table, the current digest and contract, the certificate and its command."""
    if v.live is None:
        return _page(f"Head {v.head_id}", "<p>No update of this head is on the heads topics.</p>")
    live = v.live
    facts = _table("Current version", ["fact", "value"], [
        ["version", str(live.version)], ["mode", live.mode], ["samples retained", str(live.n_retained)],
        ["digest", f'<span class="mono" id="digest">{escape(live.digest or "(fast: none)")}</span>'],
        ["retained-rows hash", f'<span class="mono">{escape(live.retained_hash or "")}</span>'],
        ["published", _when(live.created_ts)]], "current")
    contract = ("<pre>" + escape(orjson.dumps(v.contract, option=orjson.OPT_INDENT_2).decode()) + "</pre>"
                if v.contract else "<p>No contract in the head registry.</p>")
    applied = sorted((r for r in v.receipts if r.status == "applied"), key=lambda r: r.ts)
    history = _table("Versions (the data of the plot)", ["version", "mode", "samples retained", "published"],
                     ([str(u.version), u.mode, str(u.n_retained), _when(u.created_ts)] for u in v.updates), "history")
    return _page(f"Head {v.head_id}", f"<section><h2>Now</h2>{facts}</section>"
                 f"<section><h2>History</h2>{history_coverage(v.updates, [r.ts for r in applied])}"
                 f"{history_svg(v.updates, [r.ts for r in applied])}{history}"
                 f"<p>{len(applied)} deletes applied.</p></section>"
                 f"<section><h2>Contract</h2>{contract}</section>"
                 f"<section><h2>Verifier certificate</h2>{_certificate(certificate, command)}</section>")


def _certificate(state: CertState | None, command: str) -> str:
    """The latest finished certificate, with the version it certifies, and whether one of the
    live version is being computed (the page never waits for the verifier)."""
    repro = f'<p>Run the checks of the live version again:</p><pre id="verify-command">{escape(command)}</pre>'
    if state is None:
        return "<p>The verifier could not run (see the server log).</p>" + repro
    live = f"version {state.live[1]} ({state.live[2]})"
    status, again = state.status.removesuffix(" again"), state.status.endswith(" again")
    pending = {"computing": f"A certificate of the live {live} is being computed; reload the page later.",
               "waiting": f"A certificate of the live {live} waits for the verifier (one runs at a time); reload "
                          "the page later."}.get(status, "")
    if pending and again:
        pending = "The last run of the verifier on it could not finish (see the server log), trying again. " + pending
    note = f'<p id="cert-status" data-status="{escape(status)}">{escape(pending)}</p>' if pending else ""
    cert = state.certificate
    if cert is None or state.certifies is None:
        return note + "<p>No certificate of this head has finished yet.</p>" + repro
    ok = '<span class="ok">PASS</span>' if cert["ok"] else '<span class="bad">FAIL</span>'
    of = f"version {state.certifies[1]} ({state.certifies[2]})"
    stale = "" if state.current else " (not the live version)"
    checks = _table("Checks", ["check", "status", "detail"],
                    ([escape(c["name"]), escape(c["status"]), escape(c["detail"])] for c in cert["checks"]), "cert")
    return (f'{note}<p>Certificate of <span id="cert-version">{escape(of)}</span>{stale}:</p>'
            f'<p id="certificate">{ok}: {escape(cert["summary"])}</p><p>Created {_when(cert["created_ts"])}, '
            f'certificate sha256 <span class="mono">{escape(cert["certificate_sha256"])}</span></p>{checks}{repro}')


def history_coverage(updates: Sequence[HeadUpdate], delete_times: Sequence[float]) -> str:
    """What the history covers: the versions still on the heads topics (the ledger trims them and
    Kafka compacts them, so older versions, and some between, are gone), and the deletes applied,
    all of them (receipts are kept)."""
    versions = sorted({u.version for u in updates})
    lo, hi = versions[0], versions[-1]
    gaps = hi - lo + 1 - len(versions)
    first = min(updates, key=lambda u: u.created_ts)
    kept = ("every version from the first" if lo <= 1 and not gaps else
            (f"only version {lo}" if lo == hi else f"only versions {lo} to {hi}")
            + (f" ({gaps} versions between them are gone too)" if gaps else "")
            + f": the heads topics keep no older version (the ledger trims them and Kafka compacts them), so "
            f"nothing is shown of the samples retained before {_when(first.created_ts)}")
    deletes = (f"all {len(delete_times)}, from the receipts (which are kept), from {_when(min(delete_times))}"
               if delete_times else "none yet (from the receipts, which are kept)")
    return f'<p id="history-coverage">Samples retained: {kept}. Deletes applied: {deletes}.</p>'


def history_svg(updates: Sequence[HeadUpdate], delete_times: Sequence[float]) -> str:
    """Samples retained per version over time (exact: filled circles, fast: open squares) and the
    deletes applied so far (a dashed step line); shapes and dashes tell the series apart, not colour."""
    w, h, pad = 640, 280, 48
    times = [u.created_ts for u in updates] + list(delete_times)
    t0, t1 = min(times), max(times)
    ymax = max([u.n_retained for u in updates] + [len(delete_times), 1])

    def x(t: float) -> float:
        return pad + (w - 2 * pad) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.5)

    def y(n: float) -> float:
        return h - pad - (h - 2 * pad) * n / ymax

    marks = []
    for u in updates:
        label = f"version {u.version} {u.mode}: {u.n_retained} samples"
        if u.mode == "exact":
            marks.append(f'<circle cx="{x(u.created_ts):.1f}" cy="{y(u.n_retained):.1f}" r="4" fill="#0645ad">'
                         f"<title>{escape(label)}</title></circle>")
        else:
            marks.append(f'<rect x="{x(u.created_ts) - 4:.1f}" y="{y(u.n_retained) - 4:.1f}" width="8" height="8" '
                         f'fill="none" stroke="#5a2a82" stroke-width="2"><title>{escape(label)}</title></rect>')
    steps = [f"{x(t0):.1f},{y(0):.1f}"]
    for i, t in enumerate(sorted(delete_times)):
        steps += [f"{x(t):.1f},{y(i):.1f}", f"{x(t):.1f},{y(i + 1):.1f}"]
    steps.append(f"{x(t1):.1f},{y(len(delete_times)):.1f}")
    first = min(u.created_ts for u in updates)
    oldest = min(updates, key=lambda u: u.created_ts)
    boundary = ("" if first <= t0 else  # deletes before the oldest version kept: say where the versions begin
                f'<line x1="{x(first):.1f}" y1="{pad}" x2="{x(first):.1f}" y2="{h - pad}" stroke="#595959" '
                f'stroke-dasharray="2 3"/><text x="{x(first) + 4:.1f}" y="{pad + 10}" font-size="12">'
                f"oldest version kept: {oldest.version}</text>")
    axis = (f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#111"/>'
            f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#111"/>'
            f'<text x="{pad - 6}" y="{y(ymax) + 4:.1f}" text-anchor="end" font-size="12">{ymax}</text>'
            f'<text x="{pad - 6}" y="{h - pad + 4}" text-anchor="end" font-size="12">0</text>'
            f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle" font-size="12">time (UTC) →</text>'
            f'<text x="{pad}" y="{h - pad + 16}" font-size="12">{_iso(t0)}</text>'
            f'<text x="{w - pad}" y="{h - pad + 16}" text-anchor="end" font-size="12">{_iso(t1)}</text>')
    legend = ('<circle cx="60" cy="16" r="4" fill="#0645ad"/><text x="70" y="20" font-size="12">exact version</text>'
              '<rect x="176" y="12" width="8" height="8" fill="none" stroke="#5a2a82" stroke-width="2"/>'
              '<text x="190" y="20" font-size="12">fast version</text><line x1="290" y1="16" x2="314" y2="16" '
              'stroke="#a00000" stroke-width="2" stroke-dasharray="5 3"/>'
              '<text x="320" y="20" font-size="12">deletes applied</text>')
    desc = (f"{len(updates)} versions still on the heads topics, from {min(u.version for u in updates)} to "
            f"{max(u.version for u in updates)}; {len(delete_times)} deletes applied (every receipt)")
    return (f'<svg id="history-plot" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role=\'img\' '
            f'aria-labelledby="plot-title plot-desc"><title id="plot-title">Samples retained and deletes applied '
            f'over time</title><desc id="plot-desc">{escape(desc)}</desc>{axis}{legend}'
            f'<polyline points="{" ".join(steps)}" fill="none" stroke="#a00000" stroke-width="2" '
            f'stroke-dasharray="5 3"/>{boundary}{"".join(marks)}</svg>')
