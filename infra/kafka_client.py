"""The one place the confluent-kafka client classes are instantiated.

Every client of the product is made from the settings by ``runtime/clients.py``, which
calls these; the local brokers' launchers (``infra/local``) and ``kafka_init``, which run before
any product settings exist, call them with a raw config. ``tests/test_architecture.py`` fails on a
construction anywhere else, so a client setting (security, error callback, broker profile) cannot
be bypassed by a module that builds its own client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def new_producer(conf: Mapping[str, Any]) -> Any:
    from confluent_kafka import Producer

    return Producer(dict(conf))


def new_consumer(conf: Mapping[str, Any]) -> Any:
    from confluent_kafka import Consumer

    return Consumer(dict(conf))


def new_admin(conf: Mapping[str, Any]) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(dict(conf))
