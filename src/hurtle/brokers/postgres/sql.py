"""The schema's tables, its version and upgrades, and every statement the broker runs, written
once with the schema's name in them (``Sql``): nothing relies on ``search_path``, so a statement
runs as it is on any connection to the database."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ...errors import ConfigurationError

#: The version of the tables below; a database records its own in ``meta``.
SCHEMA_VERSION = 2
DEFAULT_SCHEMA = "hurtle"
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")

#: The server's clock, in Unix seconds (the start of the transaction).
NOW = "extract(epoch FROM now())::float8"
#: The server's clock as the statement runs: what a tick claim is judged by.
CLOCK = "extract(epoch FROM clock_timestamp())::float8"

# The hot table keeps only what waits or is held: an acknowledgement deletes its row, so
# autovacuum is asked to come sooner than its defaults would on a table that churns. No index
# names ``worker`` and pages are filled to half: a claim rewrites its rows in place (a HOT
# update, no index entry written), and ``holders`` records which workers may hold rows: what
# recovery reads, then finding a dead worker's rows by ``worker`` (a scan, once per death).
# A claim of a whole page's rows needs room on that page for a new version of each, longer by
# the worker's name: at half full, about one update in six of small messages (70 bytes) finds
# none and writes two index entries. Pages filled to 40% made every one HOT and a claim of
# 1,000 cost the server 5-6 ms of CPU instead of 11, but a publish of 1,000 cost 0.8 ms more,
# and end to end (docs/benchmarks.md) neither showed through the noise: left at half.
_TABLES = """
CREATE TABLE {s}.meta (version integer NOT NULL);
CREATE SEQUENCE {s}.ids;
CREATE TABLE {s}.messages (
    id       bigint   PRIMARY KEY DEFAULT nextval('{s}.ids'),
    queue    text     NOT NULL,
    priority smallint NOT NULL,
    worker   text,
    body     bytea    NOT NULL
) WITH (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01
);
CREATE INDEX messages_ready ON {s}.messages (queue, priority DESC, id);
CREATE TABLE {s}.holders (worker text PRIMARY KEY);
CREATE TABLE {s}.delayed (
    seq      bigint   GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue    text     NOT NULL,
    eta      float8   NOT NULL,
    priority smallint NOT NULL,
    body     bytea    NOT NULL
);
CREATE INDEX delayed_due ON {s}.delayed (queue, eta);
CREATE TABLE {s}.workers (worker_id text PRIMARY KEY, deadline float8 NOT NULL);
CREATE TABLE {s}.dead (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id         text   NOT NULL UNIQUE,
    queue      text   NOT NULL,
    reason     text   NOT NULL,
    body       bytea  NOT NULL,
    failed_at  float8 NOT NULL,
    message_id text
);
CREATE INDEX dead_queue ON {s}.dead (queue, seq);
CREATE INDEX dead_message ON {s}.dead (message_id, seq) WHERE message_id IS NOT NULL;
CREATE TABLE {s}.queues (name text PRIMARY KEY);
CREATE TABLE {s}.paused (queue text PRIMARY KEY);
CREATE TABLE {s}.cancelled (id text PRIMARY KEY, until float8 NOT NULL);
CREATE INDEX cancelled_until ON {s}.cancelled (until);
CREATE TABLE {s}.results (id text PRIMARY KEY, expires float8 NOT NULL, body bytea NOT NULL);
CREATE INDEX results_expires ON {s}.results (expires);
CREATE TABLE {s}.rates (key text PRIMARY KEY, tat float8 NOT NULL);
CREATE TABLE {s}.slots (
    key text NOT NULL, worker text NOT NULL, n integer NOT NULL, PRIMARY KEY (key, worker)
);
CREATE TABLE {s}.uniques (
    queue text NOT NULL, key text NOT NULL, id text NOT NULL, expires float8 NOT NULL,
    PRIMARY KEY (queue, key)
);
CREATE INDEX uniques_expires ON {s}.uniques (expires);
CREATE TABLE {s}.schedules (
    queue text NOT NULL, name text NOT NULL, last float8 NOT NULL, PRIMARY KEY (queue, name)
);
CREATE TABLE {s}.schedule_ticks (
    queue text NOT NULL, name text NOT NULL, tick float8 NOT NULL, PRIMARY KEY (queue, name, tick)
);
CREATE TABLE {s}.worker_reports (
    worker_id text PRIMARY KEY, deadline float8 NOT NULL, record bytea NOT NULL
);
CREATE TABLE {s}.worker_totals (
    queue text NOT NULL, task text NOT NULL, processed bigint NOT NULL, failed bigint NOT NULL,
    retried bigint NOT NULL, dead_lettered bigint NOT NULL, PRIMARY KEY (queue, task)
);
CREATE TABLE {s}.chords (
    id text PRIMARY KEY, count integer NOT NULL, fired boolean NOT NULL, expires float8 NOT NULL
);
CREATE INDEX chords_expires ON {s}.chords (expires);
CREATE TABLE {s}.chord_members (
    chord text NOT NULL, idx integer NOT NULL, body bytea NOT NULL, PRIMARY KEY (chord, idx)
);
CREATE TABLE {s}.deaths (
    queue text NOT NULL, digest text NOT NULL, n integer NOT NULL, PRIMARY KEY (queue, digest)
);
CREATE TABLE {s}.quarantine (
    seq      bigint   GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue    text     NOT NULL,
    priority smallint NOT NULL,
    body     bytea    NOT NULL
);
CREATE INDEX quarantine_queue ON {s}.quarantine (queue, seq);
CREATE TABLE {s}.channel_counts (
    channel text PRIMARY KEY, epoch bigint NOT NULL, total bigint NOT NULL, at float8 NOT NULL
);
CREATE TABLE {s}.channel_frames (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, frame bytea NOT NULL, at float8 NOT NULL
);
CREATE TABLE {s}.probes (
    queue text NOT NULL, digest text NOT NULL, id bigint NOT NULL, PRIMARY KEY (queue, digest)
);
"""

#: Schema version -> the statements that turn it into the next one. ``hurtle db upgrade`` applies
#: them in one transaction.
UPGRADES: dict[int, str] = {
    # 1 -> 2: a row per worker that may hold messages (``holders``) instead of a row per batch
    # with its ids (``claims``), which cost a claim an insert of an array of 1,000 ids
    1: """
CREATE TABLE {s}.holders (worker text PRIMARY KEY);
INSERT INTO {s}.holders (worker) SELECT DISTINCT worker FROM {s}.claims;
DROP TABLE {s}.claims;
""",
}


def holder_key(schema: str, worker: str) -> str:
    """The advisory lock key of a worker's claims (``Sql.SHARE_KEY``, ``Sql.LOCK_KEY``)."""
    return f"{schema}\nholder\n{worker}"


def id_array(ids: Iterable[int]) -> str:
    """The text of an ``int8[]`` of ``ids``, for a parameter cast ``::int8[]``: psycopg's own
    dumping of a list of 1,000 ints cost a settling about 2 ms of Python, this about 0.1 ms."""
    return "{" + ",".join(map(str, ids)) + "}"


def check_schema_name(name: str, url: str) -> str:
    """A ``?schema=`` name, checked: lower-case letters, digits and underscores."""
    if not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"schema={name!r} in the PostgreSQL URL {url!r} is not a schema name hurtle uses: "
            "lower-case letters, digits and underscores, starting with a letter or underscore, "
            "at most 48 characters"
        )
    return name


def tables(schema: str) -> list[str]:
    """The statements that make version ``SCHEMA_VERSION`` of the tables in ``schema``."""
    return _statements(_TABLES, schema)


def upgrade(schema: str, version: int) -> list[str]:
    """The statements that turn ``version`` into the next one (``KeyError`` if none do)."""
    return _statements(UPGRADES[version], schema)


def _statements(text: str, schema: str) -> list[str]:
    return [s.strip() for s in text.format(s=f'"{schema}"').split(";") if s.strip()]


class Sql:
    """Every statement, with the schema's name in it. Parameters are ``%s`` (psycopg)."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        #: The channels of ``NOTIFY``: queues with new work (payload: the queue names, one a
        #: line) and stored results (payload: the message ids, one a line).
        self.ready_channel = f"{schema}.ready"
        self.results_channel = f"{schema}.results"
        self._cache: dict[str, str] = {}
        for name, template in vars(type(self)).items():
            if name.isupper() and isinstance(template, str):
                setattr(self, name, self.format(template))

    def format(self, template: str) -> str:
        """``template`` with ``{s}`` (the schema), ``{now}`` and ``{clock}`` filled in."""
        text = self._cache.get(template)
        if text is None:
            text = self._cache[template] = template.format(
                s=f'"{self.schema}"', now=NOW, clock=CLOCK
            )
        return text

    VERSION = "SELECT version FROM {s}.meta"
    # -- publishing: rows of (queue, priority, body) in columns --------------------------------
    # one statement: the queues' names, the ready rows, the delayed rows, and the notification
    # of the queues (delivered when the transaction commits)
    STORE = (
        "WITH q AS (INSERT INTO {s}.queues (name) SELECT DISTINCT unnest(%b::text[]) "
        "ON CONFLICT DO NOTHING), "
        "m AS (INSERT INTO {s}.messages (queue, priority, body) "
        "SELECT * FROM unnest(%b::text[], %b::int2[], %b::bytea[])), "
        "d AS (INSERT INTO {s}.delayed (queue, eta, priority, body) "
        "SELECT * FROM unnest(%b::text[], %b::float8[], %b::int2[], %b::bytea[])) "
        "SELECT count(pg_notify(%s, p)) FROM unnest(%b::text[]) p"
    )
    # the same when every ready row has one queue and one priority (a ``send_many``): those
    # two go once, and only the bodies as an array
    STORE_UNIFORM = (
        "WITH q AS (INSERT INTO {s}.queues (name) SELECT DISTINCT unnest(%b::text[]) "
        "ON CONFLICT DO NOTHING), "
        "m AS (INSERT INTO {s}.messages (queue, priority, body) "
        "SELECT %s::text, %s::int2, b FROM unnest(%b::bytea[]) b), "
        "d AS (INSERT INTO {s}.delayed (queue, eta, priority, body) "
        "SELECT * FROM unnest(%b::text[], %b::float8[], %b::int2[], %b::bytea[])) "
        "SELECT count(pg_notify(%s, p)) FROM unnest(%b::text[]) p"
    )
    INSERT = (
        "INSERT INTO {s}.messages (queue, priority, body) "
        "SELECT * FROM unnest(%b::text[], %b::int2[], %b::bytea[])"
    )
    NOTIFY = "SELECT pg_notify(%s, %s)"
    NOTIFY_MANY = "SELECT pg_notify(%s, p) FROM unnest(%b::text[]) p"
    # -- fetching ------------------------------------------------------------------------------
    ADD_WORKER = (
        "INSERT INTO {s}.workers (worker_id, deadline) VALUES (%s, {now} + %s) "
        "ON CONFLICT DO NOTHING"
    )
    UPSERT_WORKER = (
        "INSERT INTO {s}.workers (worker_id, deadline) VALUES (%s, {now} + %s) "
        "ON CONFLICT (worker_id) DO UPDATE SET deadline = excluded.deadline"
    )
    # due delayed rows of the consumer's queues (not paused) become ready, in publish order
    PROMOTE = (
        "WITH due AS (DELETE FROM {s}.delayed WHERE seq IN (SELECT seq FROM {s}.delayed "
        "WHERE queue = ANY(%s) AND eta <= {now} AND queue NOT IN (SELECT queue FROM {s}.paused) "
        "ORDER BY eta LIMIT 10000 FOR UPDATE SKIP LOCKED) RETURNING seq, queue, priority, body) "
        "INSERT INTO {s}.messages (queue, priority, body) "
        "SELECT queue, priority, body FROM due ORDER BY seq"
    )
    # The claim's plan, pinned for the rest of its transaction: the ready rows are read in the
    # order of the messages_ready index, and the held ones by their primary key. Statistics
    # of a queue that was empty when last analyzed (a burst arrives faster than autovacuum's
    # next visit) make the planner take a bitmap scan of the whole queue and sort it, for
    # every batch: a claim then costs what the backlog weighs, not what the batch does.
    PIN_CLAIM_PLAN = (
        "SELECT set_config('enable_bitmapscan', 'off', true), "
        "set_config('enable_seqscan', 'off', true)"
    )
    # The picked rows are updated where they lie (a TID scan of their ``ctid``s): they are
    # locked by this statement, so no one moves them before the update. By their primary key
    # instead, the update cost a descent of ``messages_pkey`` per row, most of a claim's time.
    _CLAIMED = (
        "taken AS (UPDATE {s}.messages m SET worker = %s "
        "WHERE m.ctid = ANY(ARRAY(SELECT ctid FROM picked)) "
        "RETURNING m.id, m.queue, m.priority, m.body), "
        "holder AS (INSERT INTO {s}.holders (worker) SELECT %s WHERE EXISTS (SELECT FROM taken) "
        "ON CONFLICT DO NOTHING) "
        "SELECT t.queue, t.id, t.body, (SELECT EXISTS (SELECT 1 FROM {s}.cancelled "
        "WHERE until > {now})) FROM taken t "
    )
    # the claim of one queue: highest priority first, then oldest (the messages_ready index)
    CLAIM_ONE = (
        "WITH picked AS (SELECT ctid FROM {s}.messages WHERE queue = %s AND worker IS NULL "
        "AND NOT EXISTS (SELECT 1 FROM {s}.paused WHERE queue = %s) "
        "ORDER BY priority DESC, id LIMIT %s FOR UPDATE SKIP LOCKED), "
        + _CLAIMED
        + "ORDER BY t.priority DESC, t.id"
    )
    # several queues, in the order given, and none after one whose probe (the message it let
    # out of quarantine) was picked: a fetch holds one probe at most
    CLAIM_MANY = (
        "WITH first AS (SELECT m.id, m.ctid, q.name, q.ord "
        "FROM unnest(%b::text[]) WITH ORDINALITY q(name, ord) "
        "CROSS JOIN LATERAL (SELECT id, ctid, priority FROM {s}.messages WHERE queue = q.name "
        "AND worker IS NULL ORDER BY priority DESC, id LIMIT %s FOR UPDATE SKIP LOCKED) m "
        "WHERE q.name NOT IN (SELECT queue FROM {s}.paused) "
        "ORDER BY q.ord, m.priority DESC, m.id LIMIT %s), "
        "picked AS (SELECT id, ctid, ord FROM first WHERE ord <= coalesce((SELECT min(f.ord) "
        "FROM first f JOIN {s}.probes pr ON pr.queue = f.name AND pr.id = f.id), ord)), "
        + _CLAIMED
        + "JOIN picked p ON p.id = t.id ORDER BY p.ord, t.priority DESC, t.id"
    )
    # after a fetch failed: the rows in the worker's name that it does not hold, taken by a
    # claim that committed while its reply was lost (a scan: no index names ``worker``)
    TAKE_BACK = (
        "SELECT queue, id, body, (SELECT EXISTS (SELECT 1 FROM {s}.cancelled "
        "WHERE until > {now})) FROM {s}.messages WHERE worker = %s "
        "AND NOT (id = ANY(%s::int8[])) ORDER BY priority DESC, id LIMIT %s FOR UPDATE"
    )
    NEXT_ETA = (
        "SELECT min(eta) FROM {s}.delayed WHERE queue = ANY(%s) "
        "AND queue NOT IN (SELECT queue FROM {s}.paused)"
    )
    READY_NOW = (
        "SELECT EXISTS (SELECT 1 FROM {s}.messages WHERE queue = ANY(%s) AND worker IS NULL "
        "AND queue NOT IN (SELECT queue FROM {s}.paused))"
    )
    # -- settling ------------------------------------------------------------------------------
    # ids come as the text of an int8[] (``id_array``)
    SETTLE = "DELETE FROM {s}.messages WHERE id = ANY(%s::int8[]) AND worker = %s"
    SETTLE_RETURNING = (
        "DELETE FROM {s}.messages WHERE id = ANY(%s::int8[]) AND worker = %s RETURNING id, priority"
    )
    # held rows given back: under new ids, at the back of their priority, in their order
    REQUEUE = (
        "UPDATE {s}.messages m SET worker = NULL, id = nextval('{s}.ids') FROM (SELECT id "
        "FROM {s}.messages WHERE id = ANY(%s::int8[]) AND worker = %s ORDER BY id) o "
        "WHERE m.id = o.id "
        "RETURNING m.queue"
    )
    # what a worker holds, found by a scan (no index names ``worker``): at its close only
    REQUEUE_WORKER = (
        "UPDATE {s}.messages m SET worker = NULL, id = nextval('{s}.ids') FROM (SELECT id "
        "FROM {s}.messages WHERE worker = %s ORDER BY id) o WHERE m.id = o.id RETURNING m.queue"
    )
    FORGET_HOLDER = "DELETE FROM {s}.holders WHERE worker = %s"
    PUT_RESULTS = (
        "INSERT INTO {s}.results (id, expires, body) "
        "SELECT i, {now} + %s, b FROM unnest(%b::text[], %b::bytea[]) AS r(i, b) "
        "ON CONFLICT (id) DO UPDATE SET expires = excluded.expires, body = excluded.body"
    )
    PUT_RESULTS_TTL = (
        "INSERT INTO {s}.results (id, expires, body) "
        "SELECT i, {now} + t, b FROM unnest(%b::text[], %b::float8[], %b::bytea[]) AS r(i, t, b) "
        "ON CONFLICT (id) DO UPDATE SET expires = excluded.expires, body = excluded.body"
    )
    EXPIRE_RESULTS = (
        "DELETE FROM {s}.results WHERE id IN (SELECT id FROM {s}.results "
        "WHERE expires <= {now} LIMIT 100)"
    )
    GET_RESULT = "SELECT body FROM {s}.results WHERE id = %s AND expires > {now}"
    INSERT_DEAD = (
        "INSERT INTO {s}.dead (id, queue, reason, body, failed_at, message_id) "
        "SELECT i, q, r, b, {now}, m FROM unnest(%b::text[], %b::text[], %b::text[], "
        "%b::bytea[], %b::text[]) AS d(i, q, r, b, m)"
    )
    # dead letters of a queue are trimmed in the order they were recorded
    EXPIRE_DEAD = (
        "DELETE FROM {s}.dead WHERE queue = %s AND seq < (SELECT seq FROM {s}.dead "
        "WHERE queue = %s AND failed_at >= {now} - %s ORDER BY seq LIMIT 1)"
    )
    CAP_DEAD = (
        "DELETE FROM {s}.dead WHERE queue = %s AND seq <= (SELECT seq FROM {s}.dead "
        "WHERE queue = %s ORDER BY seq DESC LIMIT 1 OFFSET %s)"
    )
    # -- limits --------------------------------------------------------------------------------
    LOCK_KEY = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
    # a claim holds its worker's key shared until it commits, and recovery takes it alone
    # before it takes back that worker's rows and its holder row (``holder_key``): so recovery
    # never drops the holder row of a worker whose claim it cannot see yet
    SHARE_KEY = "SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))"
    SWEEP_UNIQUES = (
        "DELETE FROM {s}.uniques WHERE (queue, key) IN (SELECT queue, key FROM {s}.uniques "
        "WHERE expires <= {now} LIMIT 1000)"
    )
    # takes the lock when free (or expired): returns a row then
    TAKE_UNIQUE = (
        "INSERT INTO {s}.uniques AS u (queue, key, id, expires) "
        "VALUES (%s, %s, %s, CASE WHEN %s > 0 THEN %s ELSE {now} + %s END) "
        "ON CONFLICT (queue, key) DO UPDATE SET id = excluded.id, expires = excluded.expires "
        "WHERE u.expires <= {now} RETURNING u.id"
    )
    UNIQUE_HOLDER = "SELECT id FROM {s}.uniques WHERE queue = %s AND key = %s"
    RELEASE_UNIQUE = (
        "DELETE FROM {s}.uniques u USING unnest(%b::text[], %b::text[], %b::text[]) "
        "AS r(q, k, i) WHERE u.queue = r.q AND u.key = r.k AND u.id = r.i"
    )
    # concurrency slots: those of dead workers are free
    FREE_DEAD_SLOTS = (
        "DELETE FROM {s}.slots WHERE key = %s AND worker NOT IN "
        "(SELECT worker_id FROM {s}.workers WHERE deadline >= {now})"
    )
    SLOTS_TAKEN = "SELECT coalesce(sum(n), 0) FROM {s}.slots WHERE key = %s"
    TAKE_SLOTS = (
        "INSERT INTO {s}.slots AS t (key, worker, n) VALUES (%s, %s, %s) "
        "ON CONFLICT (key, worker) DO UPDATE SET n = t.n + excluded.n"
    )
    GIVE_SLOTS = (
        "UPDATE {s}.slots s SET n = s.n - r.n FROM unnest(%b::text[], %b::int4[]) "
        "AS r(key, n) WHERE s.key = r.key AND s.worker = %s"
    )
    FORGET_SLOTS = "DELETE FROM {s}.slots WHERE worker = %s AND n <= 0"
    # a worker's session closed
    FORGET_REPORT = "DELETE FROM {s}.worker_reports WHERE worker_id = %s"
    FORGET_WORKER = "DELETE FROM {s}.workers WHERE worker_id = %s"
    FORGET_WORKER_SLOTS = "DELETE FROM {s}.slots WHERE worker = %s"
    # -- ticks ---------------------------------------------------------------------------------
    TICKS = (
        "SELECT (SELECT last FROM {s}.schedules WHERE queue = %s AND name = %s), "
        "ARRAY(SELECT tick FROM {s}.schedule_ticks WHERE queue = %s AND name = %s "
        "ORDER BY tick), {clock}"
    )
    CLAIM_TICK = (
        "INSERT INTO {s}.schedules AS s (queue, name, last) VALUES (%s, %s, %s) "
        "ON CONFLICT (queue, name) DO UPDATE SET last = greatest(s.last, excluded.last)"
    )
    ADD_TICK = "INSERT INTO {s}.schedule_ticks (queue, name, tick) VALUES (%s, %s, %s)"
    FORGET_TICKS = (
        "DELETE FROM {s}.schedule_ticks WHERE queue = %s AND name = %s AND tick < (SELECT tick "
        "FROM {s}.schedule_ticks WHERE queue = %s AND name = %s ORDER BY tick DESC LIMIT 1 "
        "OFFSET %s)"
    )
    LAST_TICK = "SELECT last FROM {s}.schedules WHERE queue = %s AND name = %s"
    # -- workers' reports ----------------------------------------------------------------------
    FORGET_REPORTS = "DELETE FROM {s}.worker_reports WHERE deadline < {now}"
    UPSERT_REPORT = (
        "INSERT INTO {s}.worker_reports (worker_id, deadline, record) VALUES (%s, {now} + %s, %s) "
        "ON CONFLICT (worker_id) DO UPDATE SET deadline = excluded.deadline, "
        "record = excluded.record"
    )
    ADD_TOTALS = (
        "INSERT INTO {s}.worker_totals AS t SELECT * FROM unnest(%b::text[], %b::text[], "
        "%b::int8[], %b::int8[], %b::int8[], %b::int8[]) ON CONFLICT (queue, task) DO UPDATE "
        "SET processed = t.processed + excluded.processed, failed = t.failed + excluded.failed, "
        "retried = t.retried + excluded.retried, "
        "dead_lettered = t.dead_lettered + excluded.dead_lettered"
    )
