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
delete in one partition). Each returns a :class:`RequestHandle` naming the event id.

Feature vectors travel as JSON numbers by default, or as binary floats (``features_encoding=
"f64"`` exact, ``"f32"`` half the bytes, quantized from the float32 values) on the client or per
call: high-rate producers save bytes and the featurizer's parsing. JSON stays the default because
JSON requests stay readable on the topic and in dead letters (docs/client.md).

**Receipts**: a delete or delete_subject is answered on ``<prefix>receipts`` by exactly one
receipt (applied, or rejected with a reason) carrying the request's event id. One
:class:`ReceiptListener` per client reads that topic in a background thread (an
``infra.topic_reader.TopicFollower`` started at the topic's end). It is started, and
its start offsets are fixed, *before* the first delete is produced, and every delete's event id
is registered before its request is produced, so a receipt can never slip past unseen however
fast the pipeline answers. See docs/client.md.

**Transit sealing** (``UNLEARN_TRANSIT_SEAL``, default ``auto``; docs/client.md, docs/erasure.md
section 5), also used by the CLI and the demo: an add's input is sealed under the transit key the
featurizer of the head's by-head partition publishes, so it becomes unreadable in ``requests``
once that key is destroyed. Signatures cover the sealed bytes. The featurizer owning by-head
partition P publishes P's current transit key on ``<prefix>transit-keys`` (record key ``p<P>``,
partition P modulo the topic's partition count). :class:`TransitKeyCache` finds a head's
partition exactly as the router does (``infra.between_stages.head_partition`` over the by-head
topic's partition count from topic metadata), reads the tail of that partition of
``transit-keys`` and keeps the newest key whose ``use_until`` is still ahead; it reads again once
that has passed. :func:`seal_for_transit` applies ``UNLEARN_TRANSIT_SEAL``: ``auto`` seals,
waiting up to ``UNLEARN_TRANSIT_WAIT_SECONDS`` for a key when none is published yet (a deployment
that has only just started), then raises :class:`TransitUnavailable`: it never sends plaintext for
want of a key; ``always`` raises at once when none is published; ``off`` never seals (deployments
that publish no transit keys).

Sealing reuses one ephemeral key per transit key (:meth:`TransitKeyCache.sealer_for`, a
``schemas/sealed.TransitSealer`` per by-head partition): one X25519 exchange per producer session
and epoch, not per request. A new one is made when the partition's transit key changes or after
``SEALER_MAX_MESSAGES`` requests; the old one's derived AES key is dropped then, and any whose key
is past ``use_until`` on the next add or :meth:`~TransitKeyCache.close`. Safe for threads
producing through one client: the cache's lock makes one sealer per partition and key, the
sealer's lock counts its seals exactly, and a seal that finds its sealer exhausted by another
thread (``SealerExhausted``) asks the cache again, which rolls a new one.

A sealed request must be delivered before its key is destroyed: :func:`transit_producer_overrides`
bounds librdkafka's ``message.timeout.ms`` below ``UNLEARN_TRANSIT_GRACE_SECONDS``, so a late
delivery fails loudly at the producer instead of arriving after the destruction.
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
from confluent_kafka import KafkaError, KafkaException, Producer

from unlearn.infra import tracing
from unlearn.infra.between_stages import head_partition, routed_topic_name
from unlearn.infra.settings import ErasureSettings, Settings, consumer_config, producer_config
from unlearn.infra.topic_reader import LogRecord, TopicFollower, TopicReadError, read_range
from unlearn.schemas.delta_codec import CodecError
from unlearn.schemas.envelope import (
    FeatureDtype,
    FeaturesInput,
    ImageInput,
    Input,
    InvalidRequest,
    Request,
    SealedInput,
    TextInput,
    encode_request,
)
from unlearn.schemas.receipts import Receipt, decode_receipt
from unlearn.schemas.sealed import (
    SEALER_MAX_MESSAGES,
    SealerExhausted,
    TransitError,
    TransitPublicKey,
    TransitSealer,
    decode_public_record,
)
from unlearn.schemas.signature import Signer
from unlearn.services.client.settings import ClientSettings

__all__ = [
    "TransitUnavailable",
    "FEATURES_ENCODINGS",
    "ClientError",
    "DeliveryFailed",
    "FeaturesEncoding",
    "InvalidRequest",
    "ReceiptListener",
    "ReceiptTimeout",
    "RequestHandle",
    "UnlearnClient",
    "make_input",
    "new_event_id",
]

log = logging.getLogger("unlearn.client")

_TAIL = 32  # records read back from the end of a transit-keys partition (a few epochs per by-head partition)
_MARGIN_S = 1.0  # a key is used only while its use_until is at least this far ahead
_RETRY_S = 1.0  # at most one read per partition this often while none is published


class TransitUnavailable(RuntimeError):
    """No transit key is published for the head's partition (``always``), or none came within
    ``UNLEARN_TRANSIT_WAIT_SECONDS`` (``auto``): the add is not sent."""


def transit_producer_overrides(settings: Settings) -> dict[str, Any]:
    """librdkafka settings of a producer that seals: ``message.timeout.ms`` at three quarters of
    the grace (the rest covers clock skew), so a sealed request is delivered or fails before its
    key can be destroyed. Empty when sealing is off."""
    if ClientSettings.of(settings).transit_seal == "off":
        return {}
    return {"message.timeout.ms": max(1000, int(ErasureSettings.of(settings).transit_grace_seconds * 750))}


class TransitKeyCache:
    """The published transit keys, per by-head partition, as a producer needs them (thread-safe)."""

    def __init__(self, settings: Settings, requests_topic: str | None = None,
                 max_messages: int = SEALER_MAX_MESSAGES) -> None:
        self.settings = settings
        self.max_messages = max_messages  # per ephemeral key (tests set it low)
        self.topic = settings.topic("transit-keys")
        self.by_head = routed_topic_name(requests_topic or settings.topic("requests"))
        self.keys: dict[int, TransitPublicKey] = {}
        self.sealers: dict[int, TransitSealer] = {}  # per by-head partition, for its current key
        self._partitions: tuple[int, int] | None = None  # (by-head count, transit-keys count)
        self._tried: dict[int, float] = {}
        self._lock = threading.Lock()
        self._consumer: Any = None

    def key_for(self, head_id: str) -> TransitPublicKey | None:
        """The key to seal an add of ``head_id`` with now, or None if none is published."""
        with self._lock:
            found = self._key(head_id)
            return None if found is None else found[1]

    def sealer_for(self, head_id: str) -> TransitSealer | None:
        """The sealer for an add of ``head_id`` now (None: no key published): the partition's
        current one, or a new ephemeral key when its transit key changed or it is exhausted."""
        with self._lock:
            found = self._key(head_id)
            now = time.time()
            for q in [q for q, s in self.sealers.items() if s.public.use_until <= now]:
                del self.sealers[q]  # a derived key is kept no longer than its transit key is used
            if found is None:
                return None
            p, key = found
            sealer = self.sealers.get(p)
            if sealer is None or sealer.public.key_id != key.key_id or sealer.exhausted:
                sealer = self.sealers[p] = TransitSealer(key, self.max_messages)
            return sealer

    def _key(self, head_id: str) -> tuple[int, TransitPublicKey] | None:
        counts = self._counts()
        if counts is None:
            return None
        p = head_partition(head_id, counts[0])
        key = self.keys.get(p)
        now = time.time()
        if key is None or key.use_until - _MARGIN_S <= now:
            if now - self._tried.get(p, 0.0) < _RETRY_S:
                return None
            self._tried[p] = now
            key = self._read(p, counts[1])
        return (p, key) if key is not None and key.use_until - _MARGIN_S > now else None

    def wait_for(self, head_id: str, timeout: float) -> TransitPublicKey | None:
        """:meth:`key_for`, retried until a key is published or ``timeout`` passes (None)."""
        deadline = time.monotonic() + timeout
        while True:
            key = self.key_for(head_id)
            if key is not None or time.monotonic() >= deadline:
                return key
            time.sleep(0.5)

    def _counts(self) -> tuple[int, int] | None:
        if self._partitions is None:
            md = self._consumer_().list_topics(timeout=self.settings.admin_timeout).topics  # all: never creates
            by_head = md.get(self.by_head) or md.get(self.settings.topic("requests"))  # the router copies its count
            keys = md.get(self.topic)
            if by_head is None or keys is None or by_head.error is not None or keys.error is not None \
                    or not by_head.partitions or not keys.partitions:
                return None  # not learnt yet: asked again next time
            self._partitions = (len(by_head.partitions), len(keys.partitions))
        return self._partitions

    def _read(self, partition: int, n_keys: int) -> TransitPublicKey | None:
        from confluent_kafka import KafkaException, TopicPartition

        c = self._consumer_()
        q = partition % n_keys
        try:
            low, high = c.get_watermark_offsets(TopicPartition(self.topic, q), timeout=self.settings.admin_timeout)
            recs = read_range(c, self.topic, q, max(int(low), int(high) - _TAIL, 0), None, 5.0) if high > 0 else []
        except (TopicReadError, KafkaException) as exc:  # a broker hiccup: plaintext or retry, never a crash
            log.warning("reading transit keys of partition %d: %s", partition, exc)
            return None
        best: TransitPublicKey | None = None
        for _, _, value in recs:
            try:
                k = decode_public_record(value or b"")
            except TransitError:
                continue
            if k.partition == partition and (best is None or k.use_until > best.use_until):
                best = k
        if best is not None:
            self.keys[partition] = best
        return best

    def _consumer_(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer(consumer_config(
                self.settings, f"{self.settings.topic_prefix}client-transit-{uuid.uuid4().hex}",
                **{"enable.partition.eof": True, "enable.auto.commit": False}))
        return self._consumer

    def close(self) -> None:
        """Close the reader (before the broker goes away) and drop the derived sealing keys."""
        with self._lock:
            self.sealers.clear()
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None


def seal_for_transit(req: Request, keys: TransitKeyCache | None, mode: str) -> Request:
    """``req`` sealed for transit per ``mode`` (UNLEARN_TRANSIT_SEAL: auto | always | off); only
    adds are sealed. Without a published key, ``auto`` waits up to UNLEARN_TRANSIT_WAIT_SECONDS
    for one and ``always`` does not wait; then both raise :class:`TransitUnavailable`. Why:
    plaintext sent because the featurizer had not published its key yet stays readable in
    ``requests`` wherever the broker cannot delete records (docs/erasure.md section 5)."""
    if mode == "off" or keys is None or req.op != "add" or isinstance(req.input, SealedInput):
        return req
    while True:
        sealer = keys.sealer_for(req.head_id)
        if sealer is None and mode == "auto":
            wait = ClientSettings.of(keys.settings).transit_wait_seconds
            log.info("no transit key published yet for head %r: waiting up to %gs", req.head_id, wait)
            if keys.wait_for(req.head_id, wait) is not None:
                continue
            raise TransitUnavailable(
                f"no transit key was published for head {req.head_id!r} on {keys.topic} within {wait:g}s "
                "(UNLEARN_TRANSIT_WAIT_SECONDS): the add is not sent rather than sent in plaintext. Is a "
                "featurizer running and sealing? A deployment without transit keys (federated, "
                "UNLEARN_SEAL_ROWS=false) sets UNLEARN_TRANSIT_SEAL=off")
        if sealer is None:
            raise TransitUnavailable(f"no transit key is published for head {req.head_id!r} on {keys.topic} "
                                     "(is a featurizer running? UNLEARN_TRANSIT_SEAL=always)")
        try:
            return sealer.seal_request(req)
        except SealerExhausted:  # another thread took its last slot: the cache rolls a new one
            continue


FeaturesEncoding = Literal["json", "f64", "f32"]
FEATURES_ENCODINGS: dict[str, FeatureDtype | None] = {"json": None, "f64": "<f8", "f32": "<f4"}
"""``features_encoding`` -> the envelope's ``features_bin`` dtype (None: a JSON array of numbers)."""


class ClientError(RuntimeError):
    """The client cannot do what was asked (missing topic, closed client, ...)."""


class DeliveryFailed(ClientError):
    """The broker did not acknowledge a request message."""


class ReceiptTimeout(TimeoutError):
    """No receipt arrived in time. ``event_id`` and ``head_id`` say which request."""

    def __init__(self, event_id: str, head_id: str, timeout: float, topic: str, detail: str = "") -> None:
        self.event_id = event_id
        self.head_id = head_id
        self.timeout = timeout
        self.topic = topic
        msg = (f"no receipt for event {event_id!r} (head {head_id!r}) on {topic} within {timeout:g}s"
               + (f": {detail}" if detail else "")
               + "; are the featurizer and ledger workers running and caught up? "
               f"(`unlearn head --head {head_id}`; rejected requests are also in the deadletter topic)")
        super().__init__(msg)


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


# --------------------------------------------------------------------------- receipts
class _Waiter:
    __slots__ = ("event", "receipt")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.receipt: Receipt | None = None


class ReceiptListener:
    """Reads ``<prefix>receipts`` from "now" on (an ``infra.topic_reader.TopicFollower`` started at
    the end) and hands receipts to waiters.

    Only receipts of registered event ids are kept (a busy deployment's other receipts are
    dropped on sight). ``start()`` returns once every partition is assigned at an explicit offset
    no later than the current end, so anything produced after ``start()`` returns is seen.
    """

    def __init__(self, settings: Settings, *, poll_interval: float = 0.2) -> None:
        self.settings = settings
        self.topic = settings.topic("receipts")
        self.poll_interval = poll_interval
        self._waiters: dict[str, _Waiter] = {}
        self._lock = threading.Lock()
        self._follower: TopicFollower | None = None
        self.received = 0  # receipts read (all event ids)
        self.bad = 0  # undecodable receipts seen

    # ------------------------------------------------------------------ lifecycle
    @property
    def running(self) -> bool:
        return self._follower is not None and self._follower.running

    def start(self, timeout: float | None = None) -> ReceiptListener:
        """Fix the start offsets (every partition's current end), then read in a daemon thread.
        Idempotent. ``ClientError`` if the broker or the topic is not there within ``timeout``."""
        if self._follower is not None:
            return self
        follower = TopicFollower(self.settings, self.topic, self._on_record, start_at="end",
                                 role="client-receipts", poll_interval=self.poll_interval)
        try:
            follower.start(wait_assigned=self.settings.admin_timeout if timeout is None else timeout)
        except TopicReadError:
            follower.stop()
            raise ClientError(f"cannot read {self.topic} on {self.settings.bootstrap}: {follower.error or 'timed out'}"
                              " (is the broker up? run `unlearn topics create` with the same --prefix first)"
                              ) from None
        self._follower = follower
        return self

    def close(self) -> None:
        """Stop the thread and close the consumer (pending waits then time out)."""
        if self._follower is not None:
            self._follower.stop()

    # ------------------------------------------------------------------ waiting
    def register(self, event_id: str) -> None:
        """Keep the receipt of ``event_id`` when it comes (call BEFORE producing the request)."""
        with self._lock:
            self._waiters.setdefault(event_id, _Waiter())

    def forget(self, event_id: str) -> None:
        """Stop keeping the receipt of ``event_id`` (collected, or its request failed)."""
        with self._lock:
            self._waiters.pop(event_id, None)

    def get(self, event_id: str) -> Receipt | None:
        """The receipt if it already arrived (non-blocking)."""
        with self._lock:
            w = self._waiters.get(event_id)
        return w.receipt if w is not None else None

    def wait(self, event_id: str, timeout: float) -> Receipt | None:
        """Block until the receipt of a registered event id arrives; None on timeout, ClientError
        if the reading thread died (its error says why)."""
        with self._lock:
            w = self._waiters.get(event_id)
        if w is None:
            raise ClientError(f"event {event_id!r} was not registered with this receipt listener")
        deadline = time.monotonic() + max(0.0, timeout)
        while not w.event.wait(min(0.25, max(0.0, deadline - time.monotonic()))):
            failure = self._failure()
            if failure is not None:
                raise ClientError(f"receipt listener failed: {failure}")
            if time.monotonic() >= deadline:
                return None
        return w.receipt

    def _failure(self) -> str | None:
        """Why the reading thread stopped by itself (None while it runs or after ``close()``)."""
        f = self._follower
        if f is None or f.running or f.error is None:
            return None
        return f.error

    # ------------------------------------------------------------------ thread
    def _on_record(self, record: LogRecord) -> None:
        """Runs in the follower's thread: decode, and hand a registered receipt to its waiter."""
        self.received += 1
        if record.value is None:
            return
        try:
            r = decode_receipt(record.value)
        except CodecError as exc:
            self.bad += 1
            log.warning("undecodable receipt at %s/%d@%d: %s", self.topic, record.partition, record.offset, exc)
            return
        with self._lock:
            w = self._waiters.get(r.event_id)
        if w is not None and w.receipt is None:
            w.receipt = r
            w.event.set()


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
        self.receipts_topic = settings.topic("receipts")
        self._producer = Producer(producer_config(settings, **{"linger.ms": 5, **transit_producer_overrides(settings),
                                                               **(producer_overrides or {})}))
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

        while True:
            try:
                self._producer.produce(self.requests_topic, key=req.subject_id.encode("utf-8"), value=value,
                                       headers=headers, on_delivery=on_delivery)
                break
            except BufferError:  # local queue full: serve delivery reports, retry
                self._producer.poll(0.2)
            except KafkaException as exc:
                if self._listener is not None:
                    self._listener.forget(req.event_id)
                raise ClientError(f"cannot produce event {req.event_id!r}: {exc}") from exc
        self._producer.poll(0)
        return handle

    # ------------------------------------------------------------------ plumbing
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
