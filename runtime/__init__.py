"""The stream runtime: what both stages and the services run on, knowing Kafka but nothing of
unlearning (docs/design.md, "Layout").

- ``poll_loop``: the loop both stages run, a stage being a processor of its hooks;
- ``delivery``: the one produce call (a full queue waits) and acknowledgements awaited later;
- ``clients``: the one place that makes a Producer, Consumer or AdminClient from the settings,
  and the client configuration per broker kind (``BrokerQuirks``);
- ``retry``: the one retry policy of broker calls;
- ``topics``: creating, waiting for and deleting topics and records (``unlearn topics``);
- ``log_position``: watermarks, topic identity and the refusal of stale local state;
- ``topic_reader``: reading a topic to its end and following topics as they come and go;
- ``topic_family``: one logical stream kept as generation topics ``<name>.p<P>.g<G>``;
- ``family_topics``: a writer's generation topics, created, listed, trimmed and retired after a grace;
- ``probes``: broker reads off the poll loop, on a background thread.
"""
