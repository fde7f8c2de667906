"""Local brokers for the quick start, the demo, the tests and the benchmarks: the embedded tansu
(``tansu``), Apache Kafka run from the checkout's jars (``kafka``, ``secured_kafka``), the engine
choice (``engine``), the fake S3 behind a persistent tansu (``s3``) and PostgreSQL for the CDC test
(``postgres``). A cluster user never runs them; they ship in the package so that ``unlearn broker``
works for a first try (docs/design.md, "Layout")."""
