"""``unlearn audit`` over HTTP against a real pipeline run (tests/services/audit/conftest.py): the
credential, and each page's facts against the receipts, the head and the erasure report."""

from __future__ import annotations

import base64
from html import unescape

import orjson
import pytest

from tests.services.audit.support import BAD_DELETE, Audited, get, head_with_certificate, rows_by_first, tables
from unlearn.common.families import heads_family
from unlearn.runtime.topic_reader import read_topic
from unlearn.services.audit.app import authorized
from unlearn.services.audit.settings import AuditSettings
from unlearn.services.cli import main
from unlearn.services.client.head_reader import read_heads
from unlearn.services.erasure.report import erasure_report
from unlearn.services.verifier.reading import decode_receipts, read_head_records, read_head_updates


def test_a_non_loopback_address_needs_a_credential(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="UNLEARN_AUDIT_TOKEN"):
        AuditSettings(audit_host="0.0.0.0")
    with pytest.raises(ValueError, match="not a loopback"):
        AuditSettings(audit_host="audit.example.org")
    AuditSettings(audit_host="0.0.0.0", audit_token="x")
    AuditSettings(audit_host="::1")
    AuditSettings(audit_host="localhost")
    assert main(["audit", "--bootstrap", "127.0.0.1:1", "--host", "0.0.0.0"]) == 2
    assert "UNLEARN_AUDIT_TOKEN" in capsys.readouterr().err


def test_the_credential_is_checked_exactly() -> None:
    a = AuditSettings(audit_token="tok", audit_basic="u:p w")
    assert authorized(a, "Bearer tok") and authorized(a, "bearer tok")
    assert authorized(a, "Basic " + base64.b64encode(b"u:p w").decode())
    for bad in (None, "", "Bearer", "Bearer tok2", "Bearer to", "Basic " + base64.b64encode(b"u:p").decode(),
                "Basic !!!", "Token tok"):
        assert not authorized(a, bad), bad
    assert authorized(AuditSettings(), None)  # loopback without a credential: open to this host only


def test_every_page_needs_the_credential(audited: Audited) -> None:
    for path in ("/", "/subjects/alice", "/subjects/alice/erasure-report.json?head=ha", "/heads/ha",
                 "/static/audit.js"):
        status, headers, _ = get(audited.url + path, auth=None)
        assert status == 401 and "realm" in headers["WWW-Authenticate"], path
        assert get(audited.url + path, auth="Bearer nope")[0] == 401, path
    assert get(audited.url + "/healthz", auth=None)[0] == 200
    status, headers, _ = get(audited.url + "/static/audit.css", auth="basic")
    assert status == 200 and headers["Content-Type"].startswith("text/css")


def test_subject_page_shows_each_sample_with_its_receipt_or_refusal(audited: Audited) -> None:
    s, rc = audited.settings, audited.delete_a1
    status, headers, body = get(audited.url + "/subjects/alice")
    assert status == 200, body
    assert headers["Cache-Control"] == "no-store" and "script-src 'self'" in headers["Content-Security-Policy"]
    html = body.decode()
    samples = rows_by_first(tables(html)["samples"])
    assert set(samples) == {"a1", "a2", "a3"}
    # the receipt as it is on the receipts topic
    on_topic = [r for r in decode_receipts(read_topic(s, s.topic("receipts"))) if r.event_id == rc.event_id]
    assert len(on_topic) == 1 and on_topic[0].retained_hash
    a1 = samples["a1"]
    assert a1[1:3] == ["deleted", "applied"] and a1[4] == str(on_topic[0].head_version)
    assert a1[5] == on_topic[0].retained_hash
    assert samples["a2"][1] == "retained" and samples["a2"][2] == ""
    assert samples["a3"][1] == "refused" and "dimension_mismatch" in samples["a3"][6]
    receipts = rows_by_first(tables(html)["receipts"])
    assert receipts[rc.event_id][1:3] == ["applied", "a1"]
    bad = next(r for r in decode_receipts(read_topic(s, s.topic("receipts"))) if r.event_id == BAD_DELETE)
    assert bad.status == "rejected" and bad.reason
    assert receipts[BAD_DELETE][1:3] == ["rejected", "a2"] and receipts[BAD_DELETE][5] == bad.reason
    # the erasure state, as erasure-report gives it
    rep = erasure_report(s, "ha", "alice", timeout=30)
    checks = rows_by_first(tables(html)["checks"])
    assert {k: v[1] == "yes" for k, v in checks.items()} == {c.store: c.clear for c in rep.checks}
    assert ("NOT CLEAR" in html) == (not rep.clear)  # a2 is retained: its key exists, so not clear
    assert 'href="/subjects/alice/erasure-report.json?head=ha"' in html


def test_a_re_added_sample_is_retained_and_a_re_add_dated_before_its_delete_is_not(audited: Audited) -> None:
    carol = audited.extra["carol"]
    assert isinstance(carol, dict)
    status, _, body = get(audited.url + "/subjects/carol")
    assert status == 200, body
    html = body.decode()
    samples = rows_by_first(tables(html)["samples"])
    assert set(samples) == {"c1", "c2"}
    # c1: deleted (its receipt shown), then re-added after the delete in event time: retained now
    c1 = samples["c1"]
    assert c1[1:3] == ["retained (re-added after its delete)", "applied"]
    assert c1[4] == str(carol["c1"].head_version) and c1[5] == carol["c1"].retained_hash
    # c2: its re-add was dated before the delete, so the featurizer refused it: still deleted
    c2 = samples["c2"]
    assert c2[1:3] == ["deleted", "applied"] and c2[4] == str(carol["c2"].head_version)
    assert "deleted_before_arrival" in c2[6]
    assert "first excluding every sample: none: 1 retained now" in html
    assert "NOT CLEAR" in html  # c1's key exists again, as it must
    # erasure-report itself (the CLI, the JSON download) says the same: c1 is in the head again
    rep = erasure_report(audited.settings, "ha", "carol", timeout=30)
    assert rep.retained_now == ["c1"] and rep.excluded_from_version is None, rep.to_json()
    assert "retained now (re-added after a delete, or never deleted): 1" in rep.summary()


def test_the_erasure_report_download_is_erasure_reports_json(audited: Audited) -> None:
    status, headers, body = get(audited.url + "/subjects/alice/erasure-report.json?head=ha", auth="basic")
    assert status == 200 and "attachment" in headers["Content-Disposition"]
    got = orjson.loads(body)
    want = erasure_report(audited.settings, "ha", "alice", timeout=30).to_json()
    for k in ("head_id", "subject_id", "receipts", "samples", "retained_now", "excluded_from_version"):
        assert got[k] == want[k], k
    assert [c["store"] for c in got["checks"]] == [c["store"] for c in want["checks"]]
    assert get(audited.url + "/subjects/alice/erasure-report.json")[0] == 400


def test_an_unknown_subject_has_an_empty_page(audited: Audited) -> None:
    status, _, body = get(audited.url + "/subjects/nobody%20here")
    assert status == 200 and b"No head holds" in body
    status, _, body = get(audited.url + "/subjects?id=alice")
    assert status == 200 and b"<h1>Subject alice</h1>" in body  # urllib followed the 303


def test_head_page_shows_digest_history_and_a_reproducible_certificate(audited: Audited) -> None:
    s = audited.settings
    status, _, body = get(audited.url + "/heads/ha")
    assert status == 200, body
    html = body.decode()
    live = read_heads(s, ["ha"])["ha"]
    now = dict(tables(html)["current"][1:])
    assert now["digest"] == live.digest and now["version"] == str(live.version)
    assert now["samples retained"] == str(live.n_retained) == "4"
    updates, _ = read_head_updates(read_head_records(s, heads_family(s.topic_prefix), "ha"), "ha")
    # the history is what the heads topics held when the page read them (the ledger trims them and
    # Kafka compacts them, so older versions may have gone since): in version order, the live last,
    # each row as its update is on the topic
    history = tables(html)["history"][1:]
    assert history and history[-1][:3] == [str(live.version), live.mode, "4"]
    assert [int(r[0]) for r in history] == sorted(int(r[0]) for r in history)
    on_topic = {(str(u.version), u.mode): str(u.n_retained) for u in updates}
    assert all(on_topic[(v, mode)] == n for v, mode, n, _ in history if (v, mode) in on_topic)
    assert '<svg id="history-plot"' in html and "3 deletes applied" in html
    # the page says which versions the plot covers; the deletes come from every receipt
    lo = min(int(r[0]) for r in history)
    covers = html.split('id="history-coverage">')[1].split("</p>")[0]
    assert ("every version from the first" in covers) == (lo == 1 and len({r[0] for r in history}) ==
                                                          max(int(r[0]) for r in history)), covers
    assert lo == 1 or f"only version {lo}" in covers or f"only versions {lo} to" in covers, covers
    assert "Deletes applied: all 3, from the receipts" in covers
    assert '"head_id": "ha"' in unescape(html)  # the contract
    assert f"--head ha --orders 1 --partitions 1 --seed {live.version}" in html
    # the page never waits for the verifier: until the live version's certificate is done it says
    # so; then it shows that certificate, of the live version
    html = head_with_certificate(audited.url, "ha", live.version)
    assert f'id="cert-version">version {live.version} ({live.mode})</span>:' in html
    assert 'id="certificate"><span class="ok">PASS</span>' in html and 'id="cert-status"' not in html
    again = get(audited.url + "/heads/ha")[2].decode()  # the certificate is kept per version
    assert again.count("certificate sha256") == 1
    sha = html.split("certificate sha256 <span class=\"mono\">")[1][:64]
    assert sha in again
    assert b"No update of this head" in get(audited.url + "/heads/nope")[2]


def test_index_lists_heads_and_the_delete_waiting_with_its_age(audited: Audited) -> None:
    status, _, body = get(audited.url + "/")
    assert status == 200
    t = tables(body.decode())
    heads = rows_by_first(t["heads"])
    assert heads["ha"][3] == "4"
    pending = rows_by_first(t["pending"])
    assert list(pending) == [audited.pending_event]
    row = pending[audited.pending_event]
    assert row[1:4] == ["ha", "bob", "delete b2"] and row[5].endswith(" s")
    assert int(row[5].split()[0]) >= 0
