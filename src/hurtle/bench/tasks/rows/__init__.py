"""The rows of ``hurtle bench tasks``: one module per system measured, each declaring ``ROWS``, a
list of ``harness.scenario.Scenario``. ``ORDER`` is the order of the table; a module it does not
name comes after them, by name (see ``harness.registry``).

Peers run with their defaults: what a user gets from the getting-started page. Where a peer has
a faster or safer mode (Celery's thread/gevent pools, funboost's acknowledging kind), it gets its
own row.
"""

ORDER = (
    "raw_redis",
    "hurtle_redis",
    "hurtle_cluster",
    "raw_nats",
    "hurtle_nats",
    "raw_postgres",
    "hurtle_postgres",
    "pgqueuer",
    "procrastinate",
    "hurtle_sqlite",
    "celery",
    "rq",
    "dramatiq",
    "huey",
    "funboost",
    "sidekiq",
)
