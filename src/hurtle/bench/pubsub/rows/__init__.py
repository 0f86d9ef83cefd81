"""The rows of ``hurtle bench pubsub``: one module per system, each declaring ``ROWS``, a list of
``loop.Client``. ``ORDER`` is the order of the table; a module it does not name comes after them,
by name (see ``harness.registry``)."""

ORDER = ("hurtle_channels", "redis_pubsub", "zmq_proxy", "nats_core")
