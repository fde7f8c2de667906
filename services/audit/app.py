"""The audit web app: routes, the credential, and the verifier certificates (``certificates``).

Read-only: every route is a GET over facts read from the topics (``views``). Every route but
``/healthz`` needs the configured credential (a bearer token or HTTP basic auth,
``AuditSettings``); with none configured the app only listens on a loopback address.
Responses are ``no-store`` (they show personal identifiers) and allow only this app's own
script and stylesheet (Content-Security-Policy).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import logging
import shlex
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from unlearn.infra.settings import Settings
from unlearn.runtime.topic_reader import TopicReadError
from unlearn.services.erasure.report import erasure_report
from unlearn.services.verifier.certify import verify_broker
from unlearn.services.verifier.errors import VerifyError

from . import pages, views
from .certificates import Certifier
from .settings import AuditSettings

__all__ = ["build_app", "verify_command"]

log = logging.getLogger("unlearn.audit")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                      "form-action 'self'; frame-ancestors 'none'"}
SETTINGS: web.AppKey[Settings] = web.AppKey("settings", Settings)
CERTS: web.AppKey[Certifier] = web.AppKey("certs", Certifier)


def authorized(audit: AuditSettings, header: str | None) -> bool:
    """Does the Authorization header carry the configured bearer token or basic user:password?
    (Constant-time comparisons; no credential configured means loopback only, so yes.)"""
    if not audit.has_credential:
        return True
    scheme, _, value = (header or "").partition(" ")
    if audit.audit_token and scheme.lower() == "bearer":
        return hmac.compare_digest(value.strip().encode(), audit.audit_token.encode())
    if audit.audit_basic and scheme.lower() == "basic":
        try:
            given = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(given, audit.audit_basic.encode())
    return False


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    audit = AuditSettings.of(request.app[SETTINGS])
    if request.path != "/healthz" and not authorized(audit, request.headers.get("Authorization")):
        challenge = 'Basic realm="unlearn audit"' if audit.audit_basic else 'Bearer realm="unlearn audit"'
        raise web.HTTPUnauthorized(text="credential required\n", headers={"WWW-Authenticate": challenge, **HEADERS})
    try:
        resp = await handler(request)
    except TopicReadError as exc:
        log.warning("cannot read the topics: %s", exc)
        resp = web.Response(status=503, text=f"cannot read the topics: {exc}\n")
    resp.headers.update(HEADERS)
    return resp


def _html(text: str) -> web.Response:
    return web.Response(text=text, content_type="text/html", charset="utf-8")


async def _index(request: web.Request) -> web.Response:
    s = request.app[SETTINGS]
    v = await asyncio.to_thread(views.index_view, s, AuditSettings.of(s).audit_read_timeout)
    return _html(pages.index_page(v))


async def _subject_lookup(request: web.Request) -> web.Response:
    subject = request.query.get("id", "").strip()
    if not subject:
        raise web.HTTPBadRequest(text="give a subject id: /subjects?id=...\n")
    raise web.HTTPSeeOther(request.app.router["subject"].url_for(subject_id=subject))


async def _subject(request: web.Request) -> web.Response:
    s, subject = request.app[SETTINGS], request.match_info["subject_id"]
    heads = await asyncio.to_thread(views.subject_view, s, subject, AuditSettings.of(s).audit_read_timeout)
    return _html(pages.subject_page(subject, heads))


async def _subject_report(request: web.Request) -> web.Response:
    """The erasure report of one head as ``unlearn erasure-report --json`` prints it, as a download."""
    s, subject, head = request.app[SETTINGS], request.match_info["subject_id"], request.query.get("head", "")
    if not head:
        raise web.HTTPBadRequest(text="give the head: ?head=...\n")
    rep = await asyncio.to_thread(erasure_report, s, head, subject, AuditSettings.of(s).audit_read_timeout)
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"erasure-{head}-{subject}")
    return web.Response(body=orjson.dumps(rep.to_json(), option=orjson.OPT_INDENT_2), content_type="application/json",
                        headers={"Content-Disposition": f'attachment; filename="{name}.json"'})


def verify_command(settings: Settings, head: str, seed: int) -> str:
    """The ``unlearn verify`` line that re-runs the head page's certificate (same seed and sizes)."""
    a = AuditSettings.of(settings)
    return shlex.join(["unlearn", "verify", "--bootstrap", settings.bootstrap, "--prefix", settings.topic_prefix,
                       "--head", head, "--orders", str(a.audit_verify_orders), "--partitions",
                       str(a.audit_verify_partitionings), "--seed", str(seed), "--json"])


def _certify(settings: Settings, head: str, seed: int) -> dict[str, Any] | None:
    a = AuditSettings.of(settings)
    try:
        return verify_broker(settings, head, orders=a.audit_verify_orders, partitionings=a.audit_verify_partitionings,
                             seed=seed, timeout=a.audit_read_timeout).to_json()
    except VerifyError as exc:
        log.warning("verify %s: %s", head, exc)
        return None


async def _head(request: web.Request) -> web.Response:
    """Never waits for the verifier: the latest finished certificate is shown (with its version),
    one of the live (version, mode) is computed in the background (``Certifier``); the seed is
    the version, so the command shown reproduces it."""
    s, head = request.app[SETTINGS], request.match_info["head"]
    v = await asyncio.to_thread(views.head_view, s, head, AuditSettings.of(s).audit_read_timeout)
    if v.live is None:
        return _html(pages.head_page(v, None, ""))
    cert = request.app[CERTS].state((head, v.live.version, v.live.mode))
    return _html(pages.head_page(v, cert, verify_command(s, head, v.live.version)))


async def _static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name == "audit.css":
        return web.Response(text=pages.STYLE, content_type="text/css")
    if name == "audit.js":
        return web.Response(text=pages.SCRIPT, content_type="text/javascript")
    raise web.HTTPNotFound()


async def _healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def build_app(settings: Settings) -> web.Application:
    """The app over ``settings`` (its ``AuditSettings`` carry the credential)."""
    app = web.Application(middlewares=[_guard])
    app[SETTINGS] = settings
    app[CERTS] = Certifier(lambda head, seed: _certify(settings, head, seed))
    app.router.add_get("/", _index)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/subjects", _subject_lookup)
    app.router.add_get("/subjects/{subject_id}", _subject, name="subject")
    app.router.add_get("/subjects/{subject_id}/erasure-report.json", _subject_report)
    app.router.add_get("/heads/{head}", _head)
    app.router.add_get("/static/{name}", _static)
    return app
