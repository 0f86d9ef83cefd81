"""Dead letters of every road under SIGKILL, on SQLite and Redis: whatever waits on a message
that becomes a dead letter ends, and only then.

Each trial mixes, by its seed, calls that succeed with calls that fail for good (``fail``),
reject their message (``reject``), kill their process (``crash``: dead-lettered by the broker
once their workers kept dying), expire before they start (``expired``) or are cancelled
(``cancelled``), and SIGKILLs a worker process at a random moment. Then:

* workflows (chains, groups, chords, a chain of a group, a graph): every handle ends — its
  result, or ``TaskFailed`` naming how its member ended — and a workflow none of whose members
  went bad returns its result;
* results: every handle of a task that keeps results ends, with its value or the type of its
  road;
* unique locks: the same call sent again after its dead letter, whatever the reason (failed,
  rejected, worker lost, expired, cancelled, unknown task, arguments that do not fit the task,
  undecodable bytes), is enqueued (its lock ended) and runs.

A handle still waiting at the trial's deadline counts as *pending*, a good call or workflow
that did not end in its result as *lost*; both must be 0 (``Tally``). A call other than a crash
that ended as ``WorkerLost`` is counted apart, as *blamed*: its workers died more than
max_recoveries times while it was held, the last time as the one quarantined message let out
beside a killer fetched in the same batch (the broker then takes it for the killer). It ends
like any dead letter; the count says how often the poison heuristic blames an innocent.
"""

from __future__ import annotations

import contextlib
import random
import signal
import time
from typing import Any

import msgspec
import psutil
import pytest
from chaos_support import DEADLINE, TRIALS, Fleet, Tally, register, trial_rng, wait_until

from helpers import Project
from hurtle import ResultTimeout, TaskFailed, chain, chord, group
from hurtle.handles import Handle
from hurtle.message import Message, salvage

#: Deaths a message survives in these trials: an innocent would have to die three times, the
#: last alone, to be taken for a killer.
ENV = {"HURTLE_MAX_RECOVERIES": "2"}
#: ``TaskFailed.type`` of each bad road.
TYPES = {
    "fail": "ValueError",
    "reject": "Reject",
    "crash": "WorkerLost",
    "expired": "Expired",
    "cancelled": "Cancelled",
}
#: Seconds each good call sleeps.
SECONDS = 0.01
#: Seconds every handle of a trial has to end: killers die max_recoveries + 1 times, each
#: recovered a heartbeat timeout later.
WAIT = 3 * DEADLINE


def fates(rng: random.Random, n: int, bad: float, crashes: list[int]) -> list[str]:
    """``n`` roads, each bad with probability ``bad``; at most ``crashes[0]`` crashes in all."""
    out = []
    for _ in range(n):
        fate = "ok" if rng.random() >= bad else rng.choice(list(TYPES))
        if fate == "crash":
            if crashes[0] <= 0:
                fate = "fail"
            crashes[0] -= 1
        out.append(fate)
    return out


def kill_a_worker(
    fleet: Fleet, supervisor: Any, rng: random.Random, project: Project, goods: int
) -> None:
    """SIGKILL one worker process of ``supervisor`` once a random number (fewer than
    ``goods``) of calls are done."""
    at = rng.randrange(0, max(1, min(goods, 10)))
    with contextlib.suppress(AssertionError):  # whatever happened, kill one now
        wait_until(
            lambda: (
                sum(1 for r in project.runs() if r.startswith("done ")) >= at
                or supervisor.poll() is not None
            ),
            f"{at} calls done",
        )
        wait_until(lambda: bool(fleet.children(supervisor)), "a worker process")
    children = fleet.children(supervisor)
    if children:
        with contextlib.suppress(psutil.Error):  # it exited meanwhile (a crash)
            rng.choice(children).send_signal(signal.SIGKILL)


def ending(h: Any, deadline: float) -> tuple[str, Any]:
    """How ``h`` ended by ``deadline`` (``time.monotonic``): ``("value", v)``, ``("failed",
    TaskFailed)`` or ``("pending", None)``."""
    try:
        return "value", h.result(timeout=max(deadline - time.monotonic(), 0.1))
    except TaskFailed as err:
        return "failed", err
    except ResultTimeout:
        return "pending", None


# -- workflows ---------------------------------------------------------------------------------


@pytest.mark.parametrize("trial", range(TRIALS))
def test_every_workflow_ends_whatever_its_members_dead_letters_and_kills(
    project: Project, fleet: Fleet, broker: str, trial: int
) -> None:
    rng = trial_rng(f"dead-ends-workflows-{broker}", trial)
    tasks = register(project)
    kept, stale, total = tasks["chaos.kept"], tasks["chaos.stale"], tasks["chaos.total"]
    crashes = [2]
    handles: dict[str, tuple[Any, Any, bool]] = {}  # name -> (handle, expected value, bad)
    cancel: list[Any] = []
    for w in range(12):
        kind = rng.choice(["chain", "group", "chord", "nested", "graph"])
        # a nested workflow: chain(a, group(b, c), total); a graph: b and c wait for a, total
        # for both
        steps = 3 if kind in ("nested", "graph") else rng.randint(2, 4)
        roads = fates(rng, steps, 0.15, crashes)
        name = f"{kind}-{w}"
        sigs = []
        for i, fate in enumerate(roads):
            n = 100 * w + i
            if fate == "expired" and kind in ("chain", "nested", "graph") and i:
                fate = roads[i] = "fail"  # a later step's expiry counts from its previous step
            how = fate if fate in ("fail", "reject", "crash") else "ok"
            task = stale if fate == "expired" else kept
            if i and kind in ("chain", "nested", "graph"):  # given the result before it
                sigs.append(task.s(how, SECONDS))
            else:
                sigs.append(task.s(n, how, SECONDS))
        whole_cancel = kind != "group" and "cancelled" in roads
        bad = any(f != "ok" for f in roads)
        if kind == "nested":
            h: Any = chain(sigs[0], group(sigs[1], sigs[2]), total.s()).send()
            expected: Any = 2 * 100 * w
        elif kind == "graph":
            after = {"b": ["a"], "c": ["a"], "d": ["b", "c"]}
            h = project.app.graph(after, a=sigs[0], b=sigs[1], c=sigs[2], d=total.s())
            expected = {"d": 2 * 100 * w}
        elif kind == "chain":
            h = chain(*sigs).send()
            expected = 100 * w
        elif kind == "group":
            g = group(sigs).send()
            for i, (member, fate) in enumerate(zip(g.handles, roads, strict=True)):
                if fate == "cancelled":
                    cancel.append(member)
                handles[f"{name}.{i}"] = (member, 100 * w + i, fate != "ok")
            continue
        else:
            h = chord(sigs, total.s()).send()
            expected = sum(100 * w + i for i in range(len(roads)))
        if whole_cancel:
            cancel.append(h)
        handles[name] = (h, expected, bad)
    if cancel:
        project.app.cancel(*cancel)
    supervisor = fleet.start("worker", "tasks:app", "--processes", "2", **ENV)
    kill_a_worker(fleet, supervisor, rng, project, sum(not bad for _, _, bad in handles.values()))
    lost: list[str] = []
    pending: list[str] = []
    blamed: list[str] = []
    deadline = time.monotonic() + WAIT
    for name, (h, expected, bad) in handles.items():
        how, value = ending(h, deadline)
        if how == "pending":
            pending.append(name)
        elif not bad and how == "failed" and value.type == "WorkerLost":
            blamed.append(name)
        elif not bad and (how, value) != ("value", expected):
            lost.append(f"{name}: {value!r}")
    tally = Tally(
        broker, "dead ends: workflows", len(handles), lost, pending=pending, blamed=blamed
    )
    tally.save()
    assert not pending and not lost, tally


# -- results -----------------------------------------------------------------------------------


@pytest.mark.parametrize("trial", range(TRIALS))
def test_every_handle_ends_when_its_worker_is_killed_mid_batch_or_its_call_goes_bad(
    project: Project, fleet: Fleet, broker: str, trial: int
) -> None:
    rng = trial_rng(f"dead-ends-results-{broker}", trial)
    tasks = register(project)
    roads = fates(rng, 80, 0.2, [2])
    handles: list[tuple[Handle[Any], str]] = []
    cancel = []
    for n, fate in enumerate(roads):
        how = fate if fate in ("fail", "reject", "crash") else "ok"
        task = tasks["chaos.stale" if fate == "expired" else "chaos.kept"]
        h = task.send(n, how, SECONDS)
        if fate == "cancelled":
            cancel.append(h)
        handles.append((h, fate))
    project.app.cancel(*cancel)
    pool = rng.choice([("--pool", "solo"), ("--pool", "threads", "--concurrency", "4")])
    supervisor = fleet.start("worker", "tasks:app", "--processes", "1", *pool, **ENV)
    kill_a_worker(fleet, supervisor, rng, project, roads.count("ok"))
    lost: list[str] = []
    pending: list[str] = []
    blamed: list[str] = []
    deadline = time.monotonic() + WAIT
    for n, (h, fate) in enumerate(handles):
        how, value = ending(h, deadline)
        if how == "pending":
            pending.append(f"{n} ({fate})")
        elif fate != "crash" and how == "failed" and value.type == "WorkerLost":
            # an expired or cancelled one too: held, not yet looked at, behind a killer
            blamed.append(f"{n} ({fate})")
        elif fate == "ok" and (how, value) != ("value", n):
            lost.append(f"{n}: {value!r}")
        elif fate != "ok" and (how != "failed" or value.type != TYPES[fate]):
            lost.append(f"{n} ({fate}): {how} {value!r}")
    tally = Tally(broker, "dead ends: results", len(handles), lost, pending=pending, blamed=blamed)
    tally.save()
    assert not pending and not lost, tally


# -- unique locks ------------------------------------------------------------------------------


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_unique_call_sent_again_after_its_dead_letter_runs_whatever_the_reason(
    project: Project, fleet: Fleet, broker: str, trial: int
) -> None:
    rng = trial_rng(f"dead-ends-unique-{broker}", trial)
    tasks = register(project)
    once, narrow = tasks["chaos.once"], tasks["chaos.narrow"]
    ghost = project.app.task(name="chaos.ghost", unique_for=600)(lambda n: n)  # unknown there
    broker_ = project.app.broker
    reasons = ["fail", "reject", "crash", "expired", "cancelled", "unknown", "unfit"]
    rng.shuffle(reasons)
    first: dict[str, str] = {}  # reason -> id of the message whose dead letter ends the lock
    # undecodable bytes that name the lock of once("u-undecodable", "ok"): the lock taken by
    # its valid twin, dropped at once (a purge keeps locks), so that the bytes alone hold it
    twin = once.message(("u-undecodable", "ok"), {})
    assert broker_.publish_unique([twin], 600) == [twin.id]
    assert broker_.purge("default") == 1
    reasons.insert(rng.randrange(len(reasons) + 1), "undecodable")
    for reason in reasons:
        n = f"u-{reason}"
        if reason == "undecodable":
            broker_.publish_raw("default", [undecodable(twin)])
            first[reason] = twin.id
        else:
            first[reason] = send(reason, n, once, narrow, ghost).id
        once.send_many([(f"ok-{reason}-{i}", "ok", SECONDS) for i in range(rng.randint(0, 10))])
    project.app.cancel(first["cancelled"])
    supervisor = fleet.start("worker", "tasks:app", "--processes", "2", **ENV)
    kill_a_worker(fleet, supervisor, rng, project, 3)
    lost: list[str] = []
    pending: list[str] = []
    for reason in reasons:
        n = f"u-{reason}"
        try:
            wait_until(lambda i=first[reason]: dead(project, i), f"{n}'s dead letter", WAIT)
        except AssertionError:
            pending.append(f"{reason}: no dead letter")
            continue
        runs = project.lines("start").count(n)
        # the same call again (its expiry, an option, left out: it runs this time)
        again = send("ok" if reason == "expired" else reason, n, once, narrow, ghost)
        if again.id == first[reason]:
            lost.append(f"{reason}: the lock outlived the dead letter")
            continue
        try:  # sent again, it runs (an unknown task, unfit arguments: a dead letter again)
            if reason in ("unknown", "unfit"):
                wait_until(lambda h=again: dead(project, h.id), f"{n} sent again", WAIT)
            else:
                wait_until(
                    lambda n=n, runs=runs: project.lines("start").count(n) > runs,
                    f"{n} sent again to run",
                    WAIT,
                )
        except AssertionError:
            pending.append(f"{reason}: sent again, it did not run")
    tally = Tally(broker, "dead ends: unique locks", len(reasons), lost, pending=pending)
    tally.save()
    assert not pending and not lost, tally


def send(reason: str, n: str, once: Any, narrow: Any, ghost: Any) -> Handle[Any]:
    """Send the call ``n`` that goes to a dead letter for ``reason`` (the same call each time)."""
    if reason == "unknown":
        return ghost.send(n)
    if reason == "unfit":
        return narrow.send(n, "ok")
    if reason == "expired":
        return once.options(expires=0.001).send(n, "ok")
    how = reason if reason in ("fail", "reject", "crash") else "ok"
    return once.send(n, how)


def undecodable(m: Message) -> bytes:
    """The bytes of ``m`` with a priority of 99: refused by ``Message.decode``."""
    fields = list(msgspec.structs.astuple(m))
    fields[Message.__struct_fields__.index("priority")] = 99
    return msgspec.msgpack.encode(fields)


def dead(project: Project, id_: str) -> bool:
    """True when the message ``id_`` is a dead letter (bytes that do not decode: read as far as
    they can be)."""
    letters = project.app.broker.dead_letters("default", limit=1000)
    return any((m := d.message() or salvage(d.raw)) is not None and m.id == id_ for d in letters)
