"""Python client SDK for upstream apps: produce request events, wait for deletion receipts, seal
adds' inputs for transit.

    from unlearn.infra.settings import Settings
    from unlearn.services.client.sdk import UnlearnClient  # or: from unlearn.services.client import ...

    with UnlearnClient(Settings.from_env()) as client:
        client.add("faces", subject_id="u1", sample_id="img-1", label=3, features=[0.1, 0.2, ...])
        handle = client.delete("faces", sample_id="img-1", subject_id="u1")
        receipt = handle.wait_receipt(timeout=30)      # schemas.receipts.Receipt
        print(receipt.status, receipt.head_version, receipt.retained_hash)

Every call builds a v1 envelope (``schemas.envelope``; validated before it is produced) and
produces it to ``<prefix>requests`` keyed by the subject id (a subject's add always precedes its
delete in one partition). Each returns a :class:`RequestHandle` naming the event id. With
``UNLEARN_ROUTE_BY_HEAD=1`` (a producer the deployment trusts like the featurizer) it produces to
the head's partition of ``<prefix>requests.by-head`` instead, skipping the featurizer's routing
hop: one record and one broker hop less per request (docs/client.md, "Routing by head").

Feature vectors travel as JSON numbers by default, or as binary floats (``features_encoding=
"f64"`` exact, ``"f32"`` half the bytes, quantized from the float32 values) on the client or per
call: high-rate producers save bytes and the featurizer's parsing. JSON stays the default because
JSON requests stay readable on the topic and in dead letters (docs/client.md).

Receipts are read by ``services/client/receipt_listener.py``; an add's input is sealed for
transit by ``services/client/transit_key_cache.py`` (``UNLEARN_TRANSIT_SEAL``). See docs/client.md.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from confluent_kafka import KafkaError, KafkaException

from unlearn.common.by_head import head_partition, routed_topic_name
from unlearn.infra import tracing
from unlearn.infra.settings import Settings
from unlearn.runtime import clients
from unlearn.runtime.delivery import produce
from unlearn.runtime.topic_reader import TopicReadError, topic_partitions
from unlearn.schemas.envelope import Request, encode_request
from unlearn.schemas.receipts import Receipt
from unlearn.schemas.request_inputs import FeatureDtype, FeaturesInput, ImageInput, Input, TextInput
from unlearn.schemas.signature import Signer
from unlearn.services.client.errors import ClientError, DeliveryFailed, ReceiptTimeout
from unlearn.services.client.receipt_listener import ReceiptListener
from unlearn.services.client.settings import ClientSettings
from unlearn.services.client.transit_key_cache import (
    TransitKeyCache,
    TransitUnavailable,
    seal_for_transit,
    transit_producer_overrides,
)

__all__ = [
    "FEATURES_ENCODINGS",
    "FeaturesEncoding",
    "RequestHandle",
    "UnlearnClient",
    "make_input",
    "new_event_id",
]

log = logging.getLogger("unlearn.client")


FeaturesEncoding = Literal["json", "f64", "f32"]
FEATURES_ENCODINGS: dict[str, FeatureDtype | None] = {"json": None, "f64": "<f8", "f32": "<f4"}
"""``features_encoding`` -> the envelope's ``features_bin`` dtype (None: a JSON array of numbers)."""


def new_event_id() -> str:
    """A fresh, globally unique event id (UUID4, 32 hex characters)."""
    return uuid.uuid4().hex


def _features_dtype(encoding: str) -> FeatureDtype | None:
    if encoding not in FEATURES_ENCODINGS:
        raise ValueError(f"features_encoding must be one of {', '.join(FEATURES_ENCODINGS)}, got {encoding!r}")
    return FEATURES_ENCODINGS[encoding]


def make_input(*, features: Sequence[float] | np.ndarray | None = None, text: str | None = None,
               image_png: bytes | str | None = None, features_encoding: FeaturesEncoding = "json") -> Input:
    """Exactly one of ``features`` (numbers: a list or a numpy array), ``text`` or ``image_png``
    (PNG bytes, or their standard base64) becomes the envelope's ``input``; ``features_encoding``
    says how features travel ("json", or binary "f64" / "f32")."""
    given = [n for n, v in (("features", features), ("text", text), ("image_png", image_png)) if v is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of features=, text=, image_png= (got {given or 'none'})")
    dtype = _features_dtype(features_encoding)
    if features is not None:
        return FeaturesInput(features, dtype)
    if text is not None:
        return TextInput(text)
    data = image_png
    if isinstance(data, str):
        data = base64.b64decode(data.encode("ascii"), validate=True)
    return ImageInput(bytes(data), "png")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- handles


@dataclass
class RequestHandle:
    """What a produced request is known by. ``wait_receipt`` only for delete / delete_subject."""

    event_id: str
    op: str
    head_id: str
    subject_id: str
    sample_id: str | None
    _client: UnlearnClient = field(repr=False)
    _delivered: threading.Event = field(default_factory=threading.Event, repr=False)
    _delivery_error: str | None = field(default=None, repr=False)
    partition: int | None = None
    offset: int | None = None
    _receipt: Receipt | None = field(default=None, repr=False)
    traceparent: bytes | None = None  # the W3C traceparent header it was sent with

    @property
    def delivered(self) -> bool:
        """True once the broker acknowledged the message (check ``delivery_error`` too)."""
        return self._delivered.is_set() and self._delivery_error is None

    @property
    def delivery_error(self) -> str | None:
        return self._delivery_error

    def wait_delivered(self, timeout: float | None = None) -> None:
        """Block until the broker acknowledged the request; DeliveryFailed / TimeoutError."""
        t = ClientSettings.of(self._client.settings).receipt_timeout if timeout is None else timeout
        deadline = time.monotonic() + t
        while not self._delivered.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"event {self.event_id!r} (head {self.head_id!r}) was not acknowledged by "
                                   f"the broker within {t:g}s")
            self._client._poll(min(0.1, remaining))
        if self._delivery_error is not None:
            raise DeliveryFailed(f"event {self.event_id!r} (head {self.head_id!r}) was not delivered: "
                                 f"{self._delivery_error}")

    def wait_receipt(self, timeout: float | None = None) -> Receipt:
        """The deletion's receipt (status "applied", "tombstoned": removed nothing, its tombstone
        keeps older adds out, or "rejected"); ReceiptTimeout if none arrives
        within ``timeout`` seconds (default UNLEARN_RECEIPT_TIMEOUT). Adds get no receipt."""
        if self.op == "add":
            raise ClientError(f"event {self.event_id!r} is an add: only delete and delete_subject get receipts "
                              "(use wait_delivered() for an add)")
        if self._receipt is not None:
            return self._receipt
        t = ClientSettings.of(self._client.settings).receipt_timeout if timeout is None else float(timeout)
        start = time.monotonic()
        try:
            self.wait_delivered(t)
        except TimeoutError:
            raise ReceiptTimeout(self.event_id, self.head_id, t, self._client.receipts_topic,
                                 "the request itself was not acknowledged by the broker") from None
        listener = self._client._listener
        if listener is None:  # pragma: no cover - deletes always start it
            raise ClientError("no receipt listener")
        r = listener.wait(self.event_id, t - (time.monotonic() - start))
        if r is None:
            raise ReceiptTimeout(self.event_id, self.head_id, t, self._client.receipts_topic)
        self._receipt = r
        listener.forget(self.event_id)  # collected: the listener no longer needs to keep it
        return r


# --------------------------------------------------------------------------- client


class UnlearnClient:
    """Produces request envelopes; one shared receipt listener per client (started lazily by the
    first delete, or at construction with ``listen_receipts=True``). Thread-safe for producing.
    ``features_encoding`` is how ``add(features=...)`` sends vectors unless a call says otherwise."""

    def __init__(self, settings: Settings, client_id: str | None = None, *, listen_receipts: bool = False,
                 producer_overrides: dict[str, Any] | None = None, features_encoding: FeaturesEncoding = "json",
                 signer: Signer | None = None) -> None:
        _features_dtype(features_encoding)  # an unknown encoding fails here, not at the first add
        # Signed requests (docs/security.md): an explicit signer, else UNLEARN_CLIENT_KEY_FILE's key.
        client = ClientSettings.of(settings)
        self.signer = signer or (Signer.from_file(client.client_key_file, client.client_key_id or None)
                                 if client.client_key_file else None)
        self.settings = settings
        self.features_encoding: FeaturesEncoding = features_encoding
        self.client_id = client_id or ClientSettings.of(settings).client_id
        self.requests_topic = settings.topic("requests")
        self.route_by_head = client.route_by_head
        self._by_head_partitions: int | None = None  # learnt at the first routed request
        self.receipts_topic = settings.topic("receipts")
        self._producer = clients.producer(settings, **{"linger.ms": 5, **transit_producer_overrides(settings),
                                                               **(producer_overrides or {})})
        self.transit = TransitKeyCache(settings) if ClientSettings.of(settings).transit_seal != "off" else None
        self._listener: ReceiptListener | None = None
        self._listener_lock = threading.Lock()
        self._closed = False
        if listen_receipts:
            self._ensure_listener()

    # ------------------------------------------------------------------ requests
    def add(self, head_id: str, subject_id: str, sample_id: str, label: int | Sequence[float], *,
            features: Sequence[float] | np.ndarray | None = None, text: str | None = None,
            image_png: bytes | str | None = None, client_id: str | None = None,
            event_id: str | None = None, ts: float | None = None,
            features_encoding: FeaturesEncoding | None = None, traceparent: bytes | str | None = None) -> RequestHandle:
        """Add one sample (exactly one of features=, text=, image_png=) with a class index or a
        target vector as ``label``; ``features_encoding`` overrides the client's for this call."""
        lab: int | tuple[float, ...] = label if isinstance(label, int) else tuple(float(v) for v in label)
        inp = make_input(features=features, text=text, image_png=image_png,
                         features_encoding=features_encoding or self.features_encoding)
        req = Request(event_id or new_event_id(), "add", head_id, client_id or self.client_id, subject_id,
                      sample_id, lab, inp, time.time() if ts is None else ts)
        return self.send(req, traceparent=traceparent)

    def delete(self, head_id: str, sample_id: str, subject_id: str, *, client_id: str | None = None,
               event_id: str | None = None, ts: float | None = None,
               traceparent: bytes | str | None = None) -> RequestHandle:
        """Delete one sample (the featurizer reuses the add's cached features)."""
        req = Request(event_id or new_event_id(), "delete", head_id, client_id or self.client_id, subject_id,
                      sample_id, ts=time.time() if ts is None else ts)
        return self.send(req, traceparent=traceparent)

    def delete_subject(self, head_id: str, subject_id: str, *, client_id: str | None = None,
                       event_id: str | None = None, ts: float | None = None,
                       traceparent: bytes | str | None = None) -> RequestHandle:
        """Delete every sample of a subject in a head (one receipt listing them)."""
        req = Request(event_id or new_event_id(), "delete_subject", head_id, client_id or self.client_id,
                      subject_id, ts=time.time() if ts is None else ts)
        return self.send(req, traceparent=traceparent)

    def send(self, req: Request, *, traceparent: bytes | str | None = None) -> RequestHandle:
        """Produce any validated :class:`Request` (InvalidRequest if it does not conform to v1)
        with a W3C ``traceparent`` header: ``traceparent`` when given (the caller's trace; an
        invalid one is sent as given and ignored downstream), else a fresh one
        (``handle.traceparent``: follow the request across the stages, docs/operations.md)."""
        if self._closed:
            raise ClientError("client is closed")
        try:
            req = seal_for_transit(req, self.transit, ClientSettings.of(self.settings).transit_seal)
        except TransitUnavailable as exc:
            raise ClientError(str(exc)) from None
        value = encode_request(req)  # validates: a bad request fails here, not in deadletter
        tp = tracing.new_traceparent() if traceparent is None else (
            traceparent.encode() if isinstance(traceparent, str) else bytes(traceparent))
        headers = [*(self.signer.headers(value) if self.signer is not None else ()), (tracing.TRACEPARENT, tp)]
        handle = RequestHandle(req.event_id, req.op, req.head_id, req.subject_id, req.sample_id, self, traceparent=tp)
        if req.op != "add":
            # Listener first (offsets fixed), event registered, THEN produce: no receipt is missed.
            self._ensure_listener().register(req.event_id)

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                handle._delivery_error = err.str()
            else:
                handle.partition, handle.offset = msg.partition(), msg.offset()
            handle._delivered.set()

        try:
            produce(self._producer, backoff=0.2, **self._target(req.head_id), key=req.subject_id.encode("utf-8"),
                    value=value, headers=headers, on_delivery=on_delivery)
        except KafkaException as exc:
            if self._listener is not None:
                self._listener.forget(req.event_id)
            raise ClientError(f"cannot produce event {req.event_id!r}: {exc}") from exc
        self._producer.poll(0)
        return handle

    # ------------------------------------------------------------------ plumbing
    def _target(self, head_id: str) -> dict[str, Any]:
        """Where a request of ``head_id`` goes: ``requests``, or with ``route_by_head`` the head's
        partition of the by-head topic (``common.by_head.head_partition``, as the router
        would forward it)."""
        if not self.route_by_head:
            return {"topic": self.requests_topic}
        topic = routed_topic_name(self.requests_topic)
        if self._by_head_partitions is None:
            try:
                parts = topic_partitions(self._producer, self.settings, topic, self.settings.admin_timeout)
            except TopicReadError as exc:
                raise ClientError(str(exc)) from None
            if parts is None:
                raise ClientError(f"UNLEARN_ROUTE_BY_HEAD: topic {topic!r} is missing (`unlearn topics create`, "
                                  "or start a featurizer, creates it)")
            self._by_head_partitions = len(parts)
        return {"topic": topic, "partition": head_partition(head_id, self._by_head_partitions)}

    def _ensure_listener(self) -> ReceiptListener:
        with self._listener_lock:
            if self._listener is None:
                self._listener = ReceiptListener(self.settings).start()
            return self._listener

    def _poll(self, timeout: float) -> None:
        self._producer.poll(timeout)

    def flush(self, timeout: float | None = None) -> int:
        """Wait for every produced request to be acknowledged; returns how many are still queued."""
        wait = ClientSettings.of(self.settings).receipt_timeout if timeout is None else timeout
        return int(self._producer.flush(wait))

    def close(self, timeout: float = 10.0) -> None:
        """Flush outstanding requests (up to ``timeout`` seconds; what is still queued then is
        purged: its handle reports a delivery error), close the producer and stop the receipt
        listener. Close a client before its broker goes away: a client left open keeps reconnecting."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._producer.flush(timeout):
                self._producer.purge()
                self._producer.poll(0)  # hand the purged requests' delivery errors to their handles
            self._producer.close()
        finally:
            if self._listener is not None:
                self._listener.close()
            if self.transit is not None:
                self.transit.close()

    def __enter__(self) -> UnlearnClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
