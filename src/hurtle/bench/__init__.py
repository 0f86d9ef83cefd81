"""``hurtle.bench``: the comparative benchmark suite (``hurtle bench ...``).

hurtle against the raw redis-py loops it is measured by and against its peers, each run the same
way: publish N calls of ``add(5, 6)``, then consume them in separate worker processes. Nothing here
is imported by ``import hurtle``, and nothing here is part of the test run's timings.

Layout:

* ``harness/`` — how rows are run, whatever they are: throwaway servers, processes, the in-task
  probe, RSS samples, the publish-then-consume ``Runner``, rounds against a baseline, the
  registry that finds rows, shared options, reports, plots and the machine description. It knows
  no row (its ``__init__`` lists its interface).
* one package per suite, each with ``HELP``, ``describe``, ``add_options`` and ``run``:
  ``tasks/``, ``io/``, ``pubsub/``, ``http/``, ``features/`` (``cli.SUITES``).
* ``peers/`` — the code that runs inside the measured processes: each peer's task module, the
  raw loops; ``sidekiq/`` holds the Ruby side.

Adding a benchmark row
----------------------

A row is one declaration, in one place; nothing else lists it.

* ``hurtle bench tasks``: add a module to ``tasks/rows/`` whose ``ROWS`` is a list of
  ``harness.scenario.Scenario``: the publisher argv (``harness.scenario.publisher("pkg.mod:fn")``
  times ``fn(count, progress)``, which sends ``count`` tasks and returns how many), the worker
  argv (``{python}``, ``{count}``, ``{workdir}`` and ``{redis_url}`` are filled in), the
  environment, the store (``redis``, ``sqlite``, ``nats``, ``cluster``) and the modules or
  programs it needs (the row is skipped with ``install`` when one is missing). Every task body
  calls ``harness.probe.hit()``; the worker gets the broker as ``$HURTLE_BROKER_URL`` and the
  Redis as ``$HURTLE_BENCH_REDIS_URL``. Code that runs in the measured processes goes in
  ``peers/``. The row runs after the rows of ``tasks/rows/ORDER``; name its module there to
  place it. ``tests/bench/test_bench_rows.py`` adds such a module and runs it.
* ``hurtle bench pubsub``: add a module to ``pubsub/rows/`` whose ``ROWS`` is a list of
  ``pubsub.loop.Client``: a publisher factory (``Setup`` to ``(publish(i), finish())``), a
  subscriber (counting with ``loop.Counter``), what it needs and, if it brings its own broker, a
  context manager that starts it.
* ``hurtle bench features``: add one ``Feature(name, task options, worker options)`` to
  ``features/rows.ROWS``.
* ``hurtle bench io``: a variant is a pair of tasks in ``io/tasks.py`` (a ``def`` and an
  ``async def`` for the asyncio pool) named in ``VARIANTS``; every pool runs it.
* ``hurtle bench http``: its two rows are written out in ``http/__init__.py`` (``ROWS`` and
  ``run_row``), with their apps in ``http/apps.py``.

A new suite is a package with ``HELP`` (its line in ``hurtle bench --help``), ``describe()``,
``add_options(parser)`` and ``run(args)`` named in ``cli.SUITES``, built on ``harness``.
"""
