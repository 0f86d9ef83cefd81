"""The benchmark harness: what every suite of ``hurtle bench`` runs its rows with. It knows how to
start, time, probe and report; it knows no row. Its interface, module by module (import from the
module: this package imports nothing, so that a measured worker that loads ``probe`` loads no
more than it):

* ``scenario`` — ``Scenario``, the declaration of a publish-then-consume row (argv of publisher
  and worker, environment, store, what it needs), ``Row``, what it measured, and the argv
  helpers ``publisher`` and ``hurtle_worker``;
* ``runner`` — ``Runner(redis_url, workdir_root, timeout=, nats_url=, cluster_url=).run(scenario,
  count) -> Row``: publish, then consume in a worker process, timed by the probes;
* ``probe`` — ``hit()``, called by every measured task body, and ``read(dir)`` for the driver;
* ``publish`` — ``python -m hurtle.bench.harness.publish MODULE:FUNCTION COUNT``: the publisher
  process, timing ``FUNCTION(count, progress)``;
* ``rss`` — the RSS of a worker's process tree, sampled into a ``Row``;
* ``processes`` — ``spawn``, ``stop_group``, ``stop``, ``tail``, ``answers``, ``wait_until``,
  ``output``;
* ``servers`` — ``RedisServer``, ``NatsServer``, ``free_port``, ``redis_url(given)`` (a context
  giving the run's Redis) and ``flush_redis``/``flush_cluster``/``flush_nats``;
* ``registry`` — ``discover(package)``: every row declared in a rows package's modules (``ROWS``);
* ``rounds`` — ``interleave`` with a baseline row, and ratios to the baseline runs beside a row;
* ``options`` — ``suite``, the parser of one ``hurtle bench`` suite, the shared options
  (``--redis-url``, ``--json``, ``--plot``) and ``choose``;
* ``report`` — ``Ratio`` (a ratio against its target), ``over``, ``machine_line``, ``notes``
  and ``show``: a run's title, table, sections, JSON document and plot;
* ``plot`` — ``chart(measured, path, title, draw)`` for every chart, and ``plot(rows, path,
  title)``, the chart of the publish-then-consume rows;
* ``machine`` — ``describe(redis_url)``: CPU, cores, memory, OS, Python, Redis, date, commit.
"""
