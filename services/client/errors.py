"""What the client SDK raises: :class:`ClientError` (cannot talk to the deployment),
:class:`DeliveryFailed` (a request was not acknowledged) and :class:`ReceiptTimeout`.
"""

from __future__ import annotations

__all__ = [
    "ClientError",
    "DeliveryFailed",
    "ReceiptTimeout",
]


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
