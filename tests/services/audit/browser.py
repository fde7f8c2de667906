"""Headless Chromium driven over the Chrome DevTools protocol, with aiohttp's websocket client
(already a dependency: no driver or client package to pin). DevTools lets the test send the
credential as a header on every request, wait until the page's own script ran, read the page,
press Tab, and take a screenshot; ``chromium --dump-dom`` can do none of the first three.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

__all__ = ["Browser", "chromium_path"]


def chromium_path() -> str | None:
    """Debian's ``chromium`` (``make test`` installs it where missing)."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium and one tab; ``async with Browser(headers) as b: await b.open(url)``."""

    def __init__(self, headers: dict[str, str], width: int = 390, height: int = 844) -> None:
        self.headers, self.width, self.height = headers, width, height
        self._ids = itertools.count(1)
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def __aenter__(self) -> Browser:
        exe = chromium_path()
        assert exe, "chromium is not installed (make test installs it: apt-get install chromium)"
        self._dir = Path(tempfile.mkdtemp(prefix="audit-chromium-"))
        self.proc = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                      "--remote-debugging-port=0", f"--user-data-dir={self._dir}",
                                      "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)  # its helpers in one group, killed together
        port_file = self._dir / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert self.proc.poll() is None and time.monotonic() < deadline, "chromium did not start"
            await asyncio.sleep(0.1)
        port = port_file.read_text().split()[0]
        self._http = aiohttp.ClientSession()
        async with self._http.get(f"http://127.0.0.1:{port}/json/list") as r:
            tab = next(t for t in await r.json() if t["type"] == "page")
        self._ws = await self._http.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())
        await self.send("Page.enable")
        await self.send("Network.enable")
        await self.send("Network.setExtraHTTPHeaders", headers=self.headers)
        await self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                        deviceScaleFactor=1, mobile=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the browser, then its helper processes (renderer, GPU, crashpad: they outlive the
        main process for a moment and write into the profile), then remove the profile."""
        try:
            await asyncio.wait_for(self._ws.send_json({"id": next(self._ids), "method": "Browser.close"}), 10)
            await asyncio.to_thread(self.proc.wait, 10)
        except Exception:  # closing politely is best effort; the kill is not
            pass
        self._reader.cancel()
        await self._ws.close()
        await self._http.close()
        with contextlib.suppress(ProcessLookupError):  # the whole group may be gone already
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        _remove(self._dir)

    async def _read(self) -> None:
        async for msg in self._ws:
            data = msg.json()
            fut = self._pending.pop(data.get("id", -1), None)
            if fut is not None:
                fut.set_result(data)
            elif "method" in data:
                self._events.put_nowait(data)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result (``AssertionError`` on a protocol error)."""
        i = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[i] = fut
        await self._ws.send_json({"id": i, "method": method, "params": params})
        data = await asyncio.wait_for(fut, 120)
        assert "error" not in data, (method, data["error"])
        return dict(data.get("result", {}))

    async def eval(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        r = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, r["exceptionDetails"]
        return r["result"].get("value")

    async def open(self, url: str, timeout: float = 180.0, ready: bool = True) -> int:
        """Navigate, wait for the load event and (``ready``) for the page's script to have run
        (``data-ready``); the main document's HTTP status."""
        while not self._events.empty():
            self._events.get_nowait()
        await self.send("Page.navigate", url=url)
        status, loaded = 0, False
        deadline = time.monotonic() + timeout
        while not loaded:
            ev = await asyncio.wait_for(self._events.get(), max(0.1, deadline - time.monotonic()))
            if ev["method"] == "Network.responseReceived" and ev["params"]["type"] == "Document":
                status = int(ev["params"]["response"]["status"])
            loaded = ev["method"] == "Page.loadEventFired"
        while ready and await self.eval("document.documentElement.getAttribute('data-ready')") != "1":
            assert time.monotonic() < deadline, f"the page's script never ran: {url}"
            await asyncio.sleep(0.1)
        return status

    async def screenshot(self, path: Path) -> None:
        """A PNG of the whole page (beyond the phone viewport) at ``path``."""
        r = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(r["data"]))

    async def press_tab(self) -> Any:
        """Press Tab; what now has the focus (tag, text, whether an outline shows)."""
        for kind in ("rawKeyDown", "keyUp"):
            await self.send("Input.dispatchKeyEvent", type=kind, key="Tab", code="Tab", windowsVirtualKeyCode=9)
        return await self.eval("(() => { const e = document.activeElement; const s = getComputedStyle(e);"
                               " return {tag: e.tagName, text: (e.textContent || '').trim(), id: e.id,"
                               " outline: s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) >= 2}; })()")


def _remove(path: Path, tries: int = 50) -> None:
    """``rm -r`` that outlasts a process of the killed group still being reaped (a killed
    process's last writes may land after ``killpg`` returns)."""
    for _ in range(tries - 1):
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    shutil.rmtree(path, ignore_errors=True)
