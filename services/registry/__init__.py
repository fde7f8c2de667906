"""The ``unlearn heads`` command (``cli``): declare, show, list and extend head contracts on the
``<prefix>head-registry`` topic (read and written through ``common.registry``). docs/registry.md."""
