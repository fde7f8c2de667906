"""Transit sealing on the producer side: the published transit keys per by-head partition
(:class:`TransitKeyCache`) and :func:`seal_for_transit`, which applies ``UNLEARN_TRANSIT_SEAL``
(docs/client.md, "Transit sealing"; docs/erasure.md section 5). Used by the SDK, the CLI and the demo.

:class:`TransitKeyCache` finds a head's partition exactly as the router does
(``common.by_head.head_partition``), reads the tail of that partition of ``transit-keys``
and keeps the newest key whose ``use_until`` is still ahead. It reuses one
``schemas/transit.TransitSealer`` per partition and key (one X25519 exchange per producer session
and epoch, not per request). Safe for threads producing through one client: the cache's lock
makes one sealer per partition and key, the sealer's lock counts its seals exactly, and a seal
that finds its sealer exhausted by another thread (``SealerExhausted``) asks the cache again,
which rolls a new one. :func:`transit_producer_overrides` bounds ``message.timeout.ms`` so a
sealed request is delivered, or fails, before its key can be destroyed.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from confluent_kafka import KafkaException

from unlearn.common.by_head import head_partition, routed_topic_name
from unlearn.infra.settings import ErasureSettings, Settings
from unlearn.runtime import clients
from unlearn.runtime.topic_reader import TopicReadError, read_range
from unlearn.schemas.envelope import Request
from unlearn.schemas.request_inputs import SealedInput
from unlearn.schemas.transit import (
    SEALER_MAX_MESSAGES,
    SealerExhausted,
    TransitError,
    TransitPublicKey,
    TransitSealer,
    decode_public_record,
)
from unlearn.services.client.settings import ClientSettings

__all__ = [
    "TransitKeyCache",
    "TransitUnavailable",
    "seal_for_transit",
    "transit_producer_overrides",
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
        from confluent_kafka import TopicPartition

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

            self._consumer = clients.consumer(
                self.settings, f"{self.settings.topic_prefix}client-transit-{uuid.uuid4().hex}",
                **{"enable.partition.eof": True, "enable.auto.commit": False})
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
