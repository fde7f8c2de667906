"""``unlearn cdc``: rows of a PostgreSQL table train and untrain a head (docs/cdc.md): Connect
standalone with Debezium (``connect``), the pure change -> request mapping (``events``), the
checks and slot cleanup on the server (``postgres``), the command (``cli``)."""
