"""Fixtures of the serving tests (helpers: support.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.services.serving.support import Publisher
from unlearn.infra.settings import Settings


@pytest.fixture
def publish(settings: Settings) -> Iterator[Publisher]:
    pub = Publisher(settings)
    yield pub
    del pub.producer
