"""What the two stages (and the services) share, so that neither stage imports the other: the
by-head partition of a head, the ledger's checkpoint record, the project's topic families, the
key families' records and their reader, and the head and client registries. Nothing here
depends on a stage (tests/test_architecture.py)."""
