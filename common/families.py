"""The project's topic families (``runtime.topic_family``): the ledger's state
(``ledger-state``) and its head updates (``heads``), the featurizer's sample keys
(``subject-keys``) and private transit keys (``transit-private``)."""

from __future__ import annotations

from unlearn.runtime.topic_family import TopicFamily


def heads_family(prefix: str) -> TopicFamily:
    """Head updates, per ``deltas`` partition: every version the ledger publishes."""
    return TopicFamily(prefix, "heads")


def state_family(prefix: str) -> TopicFamily:
    """The ledger's durable state, per ``deltas`` partition: snapshot pieces and checkpoints."""
    return TopicFamily(prefix, "ledger-state")


def keys_family(prefix: str) -> TopicFamily:
    """Per-sample data keys, per by-head partition (the featurizer that owns partition P of
    ``requests.by-head`` writes ``subject-keys.p<P>``): docs/erasure.md."""
    return TopicFamily(prefix, "subject-keys")


def transit_private_family(prefix: str) -> TopicFamily:
    """Private halves of the transit keys, per by-head partition (same owner as ``subject-keys``):
    a family of their own so that destroying one rewrites only the one or two live transit keys,
    never every sample key (docs/erasure.md section 5)."""
    return TopicFamily(prefix, "transit-private")
