"""A worker process's long-lived heap, kept out of Python's full garbage collections:
:func:`freeze_heap`.

Why: CPython's cyclic collector occasionally runs a full (generation 2) collection, which walks
every tracked object of the process. A worker's heap once its imports and state are up is 70,000
objects (200,000 with torch, which a backbone imports), and such a collection then stopped the
featurizer for 44-54 ms and the ledger for 36-49 ms on the 2-core box (bench/results/
pipeline_bench.md, section 23), in the middle of whatever batch a delete was waiting for. What
is alive at readiness stays alive (modules, the registry, backbones), so it is frozen
(``gc.freeze``): later collections walk only what came after. Frozen objects are still freed by
reference counting; only a cycle among them waits for the next freeze, which collects first.

Only a process's entry point calls it (the heap and the collector belong to the process; tests run
workers in threads of their own process): ``unlearn featurizer`` when ready and after a backbone
loads, ``unlearn ledger`` when ready, ``unlearn serve`` once listening.
"""

from __future__ import annotations

import gc
import logging
import time

__all__ = ["freeze_heap"]

log = logging.getLogger("unlearn.runtime")


def freeze_heap() -> int:
    """Collect everything (the frozen part too), then freeze what survived; returns how many
    objects are frozen. Costs one full collection (45-90 ms), so call it where a pause is
    expected anyway: readiness, a model load."""
    started = time.monotonic()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("heap frozen: %d objects out of the collector's full passes (%.0f ms)", frozen,
             (time.monotonic() - started) * 1e3)
    return frozen
