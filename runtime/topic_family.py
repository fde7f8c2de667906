"""Topic families: one logical stream stored as generation topics ``<prefix><name>.p<P>.g<G>``.

A broker without compaction, retention or record deletion (the embedded one) keeps every record
ever written, and deleting a whole topic is the only way to free space. A writer that owns
partition P of the stream writes into generation G until it passes its size bound, then writes
the state a reader needs (a full snapshot, or the latest record per key) into G+1 and deletes G.
Deleting G is also how a writer erases what G holds. Readers follow the family: every topic whose
name matches, added as they appear and dropped as they are deleted (``topic_reader``). Each
generation topic has one partition; P names the writer's input partition, so ownership follows
the consumer group."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class TopicFamily:
    """The generation topics of one logical stream under one prefix."""

    prefix: str
    name: str

    @property
    def stem(self) -> str:
        return f"{self.prefix}{self.name}.p"

    def topic(self, partition: int, generation: int) -> str:
        """The topic of ``partition`` (the writer's input partition) at ``generation``."""
        if partition < 0 or generation < 0:
            raise ValueError(f"partition and generation must be >= 0, got {partition}, {generation}")
        return f"{self.stem}{partition}.g{generation}"

    def parse(self, topic: str) -> tuple[int, int] | None:
        """(partition, generation) of a topic of this family, else None."""
        if not topic.startswith(self.stem):
            return None
        part, sep, gen = topic[len(self.stem):].partition(".g")
        if not (sep and part.isdigit() and gen.isdigit() and part.isascii() and gen.isascii()):
            return None
        return int(part), int(gen)

    def matches(self, topic: str) -> bool:
        return self.parse(topic) is not None

    def select(self, topics: Iterable[str]) -> list[str]:
        """The family's topics among ``topics``, sorted by (partition, generation)."""
        found = [(pg, t) for t in topics if (pg := self.parse(t)) is not None]
        return [t for _, t in sorted(found)]

    def generations(self, topics: Iterable[str], partition: int) -> list[int]:
        """Generations of ``partition`` among ``topics``, ascending."""
        return sorted(pg[1] for t in topics if (pg := self.parse(t)) is not None and pg[0] == partition)

    @property
    def pattern(self) -> str:
        """A regular expression for Kafka pattern subscriptions (librdkafka: a leading ``^``;
        Java: ``Pattern.compile``)."""
        return f"^{re.escape(self.stem)}[0-9]+\\.g[0-9]+$"

    def __str__(self) -> str:
        return f"{self.stem}<P>.g<G>"
