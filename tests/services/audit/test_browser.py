"""Each audit page in headless Chromium (Debian's package; ``make test`` installs it), after its
script ran, at a phone's width: the facts on the page against the receipts and the head, the
accessibility basics (lang, viewport, labels, captions, contrast, keyboard focus, no sideways
scrolling), and a screenshot kept under test-artifacts/audit/."""

from __future__ import annotations

import asyncio
import re

import pytest

from tests.services.audit.browser import Browser, chromium_path
from tests.services.audit.support import ARTIFACTS, TOKEN, Audited, head_with_certificate
from unlearn.runtime.topic_reader import read_topic
from unlearn.services.client.head_reader import read_heads
from unlearn.services.verifier.reading import decode_receipts

pytestmark = pytest.mark.skipif(chromium_path() is None, reason="chromium not installed (make test installs it)")

# Contrast of every text element against the nearest opaque background (WCAG AA: >= 4.5), and the
# other basics a page must have; evaluated in the page.
A11Y = r"""(() => {
  const rgb = c => (c.match(/[\d.]+/g) || []).map(Number);
  const lum = c => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
                     const m = rgb(c); return 0.2126 * f(m[0]) + 0.7152 * f(m[1]) + 0.0722 * f(m[2]); };
  const bg = e => { for (; e; e = e.parentElement) { const m = rgb(getComputedStyle(e).backgroundColor);
                    if (m.length === 3 || (m.length === 4 && m[3] > 0)) return getComputedStyle(e).backgroundColor; }
                    return 'rgb(255, 255, 255)'; };
  const low = [];
  for (const e of document.querySelectorAll('body *')) {
    if (e.closest('svg') || ![...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())) continue;
    const a = lum(getComputedStyle(e).color), b = lum(bg(e));
    const r = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (r < 4.5) low.push(e.tagName + ' ' + r.toFixed(2) + ' ' + e.textContent.trim().slice(0, 30));
  }
  return {lang: document.documentElement.lang,
          viewport: !!document.querySelector('meta[name=viewport][content*="width=device-width"]'),
          unlabelled: [...document.querySelectorAll('input, select, textarea')].filter(i => !i.labels.length).length,
          uncaptioned: [...document.querySelectorAll('table')].filter(t => !t.caption).length,
          unnamedSvg: [...document.querySelectorAll('svg')].filter(s => !s.getAttribute('aria-labelledby')).length,
          overflow: document.documentElement.scrollWidth - window.innerWidth,
          clipped: [...document.querySelectorAll('.scroll')].filter(d => d.scrollWidth > d.clientWidth + 1).length,
          low};
})()"""

ROWS = "[...document.querySelectorAll('table.%s tbody tr')].map(r => [...r.cells].map(c => c.textContent.trim()))"


async def _basics(b: Browser, name: str) -> None:
    a = await b.eval(A11Y)
    assert a["lang"] == "en" and a["viewport"], a
    assert a["unlabelled"] == 0 and a["uncaptioned"] == 0 and a["unnamedSvg"] == 0, a
    assert a["overflow"] <= 0, f"{name}: the page scrolls sideways on a phone by {a['overflow']} px"
    assert a["clipped"] == 0, f"{name}: {a['clipped']} tables need sideways scrolling on a phone"
    assert not a["low"], f"{name}: text below 4.5:1 contrast: {a['low']}"
    first = await b.press_tab()
    assert first["text"] == "Skip to content" and first["outline"], first
    second = await b.press_tab()
    assert second["tag"] == "A" and second["outline"], second
    await b.screenshot(ARTIFACTS / f"{name}.png")
    assert (ARTIFACTS / f"{name}.png").stat().st_size > 1000


async def _tour(audited: Audited) -> None:
    s, rc = audited.settings, audited.delete_a1
    live = read_heads(s, ["ha"])["ha"]
    receipt = next(r for r in decode_receipts(read_topic(s, s.topic("receipts"))) if r.event_id == rc.event_id)
    async with Browser({"Authorization": f"Bearer {TOKEN}"}) as b:
        assert await b.open(audited.url + "/") == 200
        heads = {r[0]: r for r in await b.eval(ROWS % "heads")}
        assert heads["ha"][1] == str(live.version) and heads["ha"][3] == str(live.n_retained)
        pending = {r[0]: r for r in await b.eval(ROWS % "pending")}
        assert list(pending) == [audited.pending_event]
        assert re.fullmatch(r"(\d+h )?\d+m \d+s", pending[audited.pending_event][5])  # the script ticks ages
        await _basics(b, "index")
        third = await b.press_tab()  # after the skip link and the nav link: the subject field
        assert third["tag"] == "INPUT" and third["id"] == "subject", third

        assert await b.open(audited.url + "/subjects/alice") == 200
        samples = {r[0]: r for r in await b.eval(ROWS % "samples")}
        assert samples["a1"][1:3] == ["deleted", "applied"]
        assert samples["a1"][4] == str(receipt.head_version) and samples["a1"][5] == receipt.retained_hash
        assert samples["a2"][1] == "retained"
        assert samples["a3"][1] == "refused" and "dimension_mismatch" in samples["a3"][6]
        await _basics(b, "subject")
        assert await b.open(audited.url + "/subjects/carol") == 200
        samples = {r[0]: r for r in await b.eval(ROWS % "samples")}
        assert samples["c1"][1] == "retained (re-added after its delete)" and samples["c2"][1] == "deleted"

        await asyncio.to_thread(head_with_certificate, audited.url, "ha", live.version)  # computed in the background
        assert await b.open(audited.url + "/heads/ha") == 200
        assert await b.eval("document.getElementById('digest').textContent") == live.digest
        history = await b.eval(ROWS % "history")  # the versions the heads topics still held (trimmed)
        assert history[-1][:3] == [str(live.version), live.mode, str(live.n_retained)]
        exact = sum(r[1] == "exact" for r in history)
        assert await b.eval("document.querySelectorAll('#history-plot circle[cx]').length") == exact + 1  # + legend
        assert "PASS" in await b.eval("document.getElementById('certificate').textContent")
        await _basics(b, "head")
    async with Browser({}) as b:  # no credential: nothing but the refusal
        assert await b.open(audited.url + "/subjects/alice", ready=False) == 401
        assert "alice" not in await b.eval("document.body.textContent")


def test_each_page_in_headless_chromium(audited: Audited) -> None:
    asyncio.run(_tour(audited))
