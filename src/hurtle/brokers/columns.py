"""Batches in columns: what a worker hands its broker for a batch of settled calls.

A worker settles calls a batch at a time. Making one object per call for the broker to take
apart again costs its busy thread more than the broker's work, so the records of a batch
(``StoredResults``) and the unique locks it gives back (``UniqueLocks``) travel as parallel
lists plus the one value every row shares (a time to live, a queue). Both read as the
sequences the ``Consumer`` contract takes (of ``StoredResult``, of lock tuples), made row by
row on demand: a broker that works row by row takes them as it takes a list; the Redis broker
reads the columns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar, overload

from .records import Lock, StoredResult

Row = TypeVar("Row")


class _Columns(Sequence[Row], Generic[Row]):
    """Rows kept as equal-length lists (``COLUMNS``) and one value they all share
    (``SHARED``). Subclasses say how a row is made (``_row``) and how they are built from the
    shared value and the columns (``_build``)."""

    __slots__ = ()
    COLUMNS: ClassVar[tuple[str, ...]]
    SHARED: ClassVar[str]

    @classmethod
    def _build(cls, shared: Any, columns: list[list[Any]]) -> Any:
        raise NotImplementedError

    def _row(self, shared: Any, *values: Any) -> Row:
        raise NotImplementedError

    def _check(self) -> None:
        lengths = [len(getattr(self, c)) for c in self.COLUMNS]
        if len(set(lengths)) > 1:
            raise ValueError(
                ", ".join(f"{n} {c}" for n, c in zip(lengths, self.COLUMNS, strict=True))
                + ": the columns differ in length"
            )

    def _columns(self) -> list[list[Any]]:
        return [getattr(self, c) for c in self.COLUMNS]

    def __len__(self) -> int:
        return len(getattr(self, self.COLUMNS[0]))

    @overload
    def __getitem__(self, i: int) -> Row: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Row]: ...
    def __getitem__(self, i: int | slice) -> Row | Sequence[Row]:
        shared = getattr(self, self.SHARED)
        if isinstance(i, slice):
            return self._build(shared, [c[i] for c in self._columns()])  # type: ignore[no-any-return]
        return self._row(shared, *(c[i] for c in self._columns()))

    def __iter__(self) -> Iterator[Row]:
        shared = getattr(self, self.SHARED)
        for values in zip(*self._columns(), strict=True):
            yield self._row(shared, *values)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({len(self)} rows, {self.SHARED}={getattr(self, self.SHARED)!r})"
        )

    @classmethod
    def join(cls, parts: Sequence[Sequence[Row]]) -> Sequence[Row]:
        """``parts`` as one sequence: columns still when every part is of this class with
        the same shared value (the usual flush), else a list of rows."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        if isinstance(first, cls):
            shared = getattr(first, cls.SHARED)
            if all(isinstance(p, cls) and getattr(p, cls.SHARED) == shared for p in parts):
                columns: list[list[Any]] = [[] for _ in cls.COLUMNS]
                for p in parts:
                    for column, more in zip(columns, p._columns(), strict=True):  # type: ignore[attr-defined]
                        column += more
                return cls._build(shared, columns)  # type: ignore[no-any-return]
        return [row for p in parts for row in p]


class ResultBatch(NamedTuple):
    """Succeeded records of one batch of calls of one task, made as one (``body``, a broker
    that stores batches keeps it whole) and, on demand, one by one (``payloads()``, for the
    brokers that store records one by one); ``size`` records. With no body, the records are
    stored one by one everywhere (a batch too small to be kept whole)."""

    size: int
    body: bytes
    payloads: Callable[[], list[bytes]]


class StoredResults(_Columns[StoredResult]):
    """The records of one batch of calls: ``payloads[i]`` is kept under ``ids[i]``, each for
    ``ttl`` seconds (``middleware.results``). Made from ``batches`` (``ResultBatch``, in the
    order of ``ids``), the payloads are made the first time they are read: a broker that
    stores batches whole (``Broker.result_batches``) never reads them."""

    __slots__ = ("_payloads", "batches", "ids", "ttl")
    COLUMNS = ("ids", "payloads")
    SHARED = "ttl"

    def __init__(
        self,
        ids: list[str],
        payloads: list[bytes] | None,
        ttl: float,
        batches: list[ResultBatch] | None = None,
    ) -> None:
        self.ids = ids
        self._payloads = payloads
        self.ttl = ttl
        self.batches = batches if payloads is None else None
        if payloads is not None:
            self._check()
        elif batches is None:
            raise ValueError("StoredResults needs payloads or batches")
        elif sum(b.size for b in batches) != len(ids):
            raise ValueError(
                f"{len(ids)} ids, {sum(b.size for b in batches)} records in batches: "
                "the columns differ in length"
            )

    @property
    def payloads(self) -> list[bytes]:
        if self._payloads is None:
            assert self.batches is not None
            self._payloads = [p for b in self.batches for p in b.payloads()]
            self.batches = None
        return self._payloads

    @classmethod
    def _build(cls, shared: Any, columns: list[list[Any]]) -> StoredResults:
        return cls(columns[0], columns[1], shared)

    def _row(self, shared: Any, *values: Any) -> StoredResult:
        return StoredResult(values[0], values[1], shared)

    @classmethod
    def join(cls, parts: Sequence[Sequence[StoredResult]]) -> Sequence[StoredResult]:
        """``parts`` as one: with batches when any part has them (a part without, one batch
        with no body: its records stay one by one)."""
        if len(parts) > 1 and all(
            isinstance(p, StoredResults) and p.ttl == parts[0].ttl  # type: ignore[attr-defined]
            for p in parts
        ):
            joined: list[StoredResults] = parts  # type: ignore[assignment]
            if any(p.batches is not None for p in joined):
                ids = list(chain.from_iterable(p.ids for p in joined))
                batches = [
                    b
                    for p in joined
                    for b in (
                        p.batches
                        if p.batches is not None
                        else [ResultBatch(len(p), b"", p.payloads.copy)]
                    )
                ]
                return cls(ids, None, joined[0].ttl, batches)
        return super().join(parts)


class UniqueLocks(_Columns[Lock]):
    """The unique locks a batch of settled calls of one queue gives back: lock ``i`` is
    ``(queue, keys[i], ids[i], untils[i])`` (``middleware.unique``)."""

    __slots__ = ("ids", "keys", "queue", "untils")
    COLUMNS = ("keys", "ids", "untils")
    SHARED = "queue"

    def __init__(self, queue: str, keys: list[str], ids: list[str], untils: list[float]) -> None:
        self.queue = queue
        self.keys = keys
        self.ids = ids
        self.untils = untils
        self._check()

    @classmethod
    def _build(cls, shared: Any, columns: list[list[Any]]) -> UniqueLocks:
        return cls(shared, columns[0], columns[1], columns[2])

    def _row(self, shared: Any, *values: Any) -> Lock:
        return (shared, values[0], values[1], values[2])
