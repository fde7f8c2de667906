"""What the tests of background reads share (tests/runtime/test_probes.py and the
shredder's, tests/streams/featurizer/test_erasure.py): a consumer stand-in that records its close,
and how long a test waits for a gated read."""

from __future__ import annotations

WAIT = 30.0


class Closable:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True
