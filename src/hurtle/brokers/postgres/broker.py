"""``PostgresBroker``: publishing, unique locks, rate limits, tick claims and results."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Unpack

import psycopg

from ...ids import new_id
from ...message import Message, check_messages, encode_many
from ..base import Broker, BrokerOptions, Consumer
from ..common import gcra
from ..ticks import RECENT_TICKS, TAKEN, WON, TickBatch, TickClaim, claimable, too_early
from . import flows
from .admin import _Admin
from .consumer import PostgresConsumer
from .listener import Listener
from .publishing import items_of, store, take_locks
from .transactions import cursor_of


class PostgresBroker(_Admin, Broker):
    """The broker contract on one PostgreSQL database, in one schema of it."""

    def __init__(self, url: str, *, create: bool = True, **options: Unpack[BrokerOptions]) -> None:
        super().__init__(**options)
        self._setup(url, create)
        self._listener = Listener(self)

    def _forked(self) -> None:
        self._listener = Listener(self)

    # -- producer side ---------------------------------------------------------------------

    def publish(self, messages: Sequence[Message]) -> None:
        check_messages(messages)
        if not messages:
            return
        batch = messages if isinstance(messages, list) else list(messages)
        items = items_of(batch, encode_many(batch, self.max_message_size))
        now = time.time()
        self._run(
            f"publishing {len(batch)} messages",
            lambda cur: store(cur, self._sql, items, now),
            transaction=False,
        )

    def publish_raw(self, queue: str, payloads: Sequence[bytes]) -> None:
        if not payloads:
            return
        items = [(queue, 0, 0.0, bytes(raw)) for raw in payloads]
        self._run(
            f"publishing {len(items)} messages",
            lambda cur: store(cur, self._sql, items, 0.0),
            transaction=False,
        )

    def publish_unique(self, messages: Sequence[Message], unique_for: float) -> list[str]:
        check_messages(messages)
        batch = list(messages)
        if not batch:
            return []
        raws = encode_many(batch, self.max_message_size)

        def run(cur: psycopg.Cursor[Any]) -> list[str]:
            items, holders = take_locks(cur, self._sql, batch, raws, unique_for)
            store(cur, self._sql, items, time.time())
            return holders

        return self._run(f"publishing {len(batch)} unique messages", run)

    def publish_in(
        self, connection: object, messages: Sequence[Message], unique_for: float | None = None
    ) -> list[str]:
        check_messages(messages)
        batch = messages if isinstance(messages, list) else list(messages)
        if not batch:
            return []
        raws = encode_many(batch, self.max_message_size)
        sql = self._sql
        doing = f"writing {len(batch)} messages"
        with cursor_of(connection, self.url, doing) as cur:
            if unique_for is None:
                store(cur, sql, items_of(batch, raws), time.time())
                return [m.id for m in batch]
            items, holders = take_locks(cur, sql, batch, raws, unique_for)
            store(cur, sql, items, time.time())
            return holders

    def take_tokens(
        self, requests: Sequence[tuple[str, int, float, int]]
    ) -> list[tuple[int, float]]:
        if not requests:
            return []
        keys = sorted({r[0] for r in requests})  # locked in one order: no deadlock
        sql = self._sql

        def run(cur: psycopg.Cursor[Any]) -> list[tuple[int, float]]:
            cur.execute(
                sql.format(
                    "INSERT INTO {s}.rates (key, tat) SELECT unnest(%b::text[]), 0 "
                    "ON CONFLICT DO NOTHING"
                ),
                (keys,),
            )
            rows = cur.execute(
                sql.format(
                    "SELECT key, tat, {now} FROM {s}.rates WHERE key = ANY(%s) "
                    "ORDER BY key FOR UPDATE"
                ),
                (keys,),
            ).fetchall()
            tats = {key: tat for key, tat, _ in rows}
            now = rows[0][2]
            out = []
            for key, limit, period, wanted in requests:
                granted, wait, tats[key] = gcra(tats[key], now, limit, period, wanted)
                out.append((granted, wait))
            cur.execute(
                sql.format(
                    "UPDATE {s}.rates r SET tat = n.tat FROM unnest(%b::text[], %b::float8[]) "
                    "AS n(key, tat) WHERE r.key = n.key"
                ),
                (list(tats), list(tats.values())),
            )
            return out

        return self._run("taking rate-limit tokens", run)

    # -- schedules -------------------------------------------------------------------------

    def _store_tick(self, batch: TickBatch) -> TickClaim:
        queue, name, tick, keys = batch.queue, batch.name, float(batch.tick), batch.keys
        messages, payloads, unique_for = list(batch.messages), batch.payloads, batch.unique_for
        sql = self._sql

        def run(cur: psycopg.Cursor[Any]) -> TickClaim:
            cur.execute(sql.LOCK_KEY, (f"{self.schema}\ntick\n{queue}\n{name}",))
            row = cur.execute(sql.TICKS, (queue, name, queue, name)).fetchone()
            assert row is not None
            last, recent, now = row
            if not claimable(tick, list(recent), last):
                return TAKEN
            early = too_early(tick, now)
            if early is not None:
                return early
            cur.execute(sql.CLAIM_TICK, (queue, name, tick))
            cur.execute(sql.ADD_TICK, (queue, name, tick))
            if len(recent) >= RECENT_TICKS:
                cur.execute(sql.FORGET_TICKS, (queue, name, queue, name, RECENT_TICKS - 1))
            if unique_for is None:
                items, holders = items_of(messages, payloads), [m.id for m in messages]
            else:
                items, holders = take_locks(cur, sql, messages, payloads, unique_for, keys)
            store(cur, sql, items, time.time())
            held_by = next((h for h, m in zip(holders, messages, strict=True) if h != m.id), None)
            return WON if held_by is None else TickClaim(True, held_by=held_by)

        return self._run(f"claiming tick {tick} of schedule {name!r}", run)

    def last_tick(self, queue: str, name: str) -> float | None:
        with self._cursor("reading a schedule's last tick") as cur:
            row = cur.execute(self._sql.LAST_TICK, (queue, name)).fetchone()
        return None if row is None else float(row[0])

    # -- consumers and results -------------------------------------------------------------

    def consumer(self, queues: Sequence[str], worker_id: str | None = None) -> Consumer:
        return PostgresConsumer(
            self, tuple(queues), worker_id or f"postgres-{os.getpid()}-{new_id()}"
        )

    def get_result(self, id: str) -> bytes | None:
        with self._cursor("reading a result") as cur:
            row = cur.execute(self._sql.GET_RESULT, (id,)).fetchone()
        return None if row is None else bytes(row[0])

    def watch_results(
        self, ids: Sequence[str], wake: Callable[[], None]
    ) -> Callable[[], None] | None:
        stop: Callable[[], None] = self._listener.watch(ids, wake)
        return stop

    def chord_results(self, id: str, total: int) -> list[bytes] | None:
        return flows.chord_results(self, id, total)

    def close(self) -> None:
        self._listener.close()
        self._close_pool()
