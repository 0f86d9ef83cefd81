"""A poison task — one that kills the process running it (``os._exit``) — is not delivered
forever: after a bounded number of deliveries its message becomes a dead letter that says why.

The bound is the setting ``HURTLE_MAX_RECOVERIES``: the deaths of its worker a message survives
(README). The message runs at most once more than that, whatever the task's retries (here 1:
a death is not an exception the task could retry), and exactly once more when it is the only
message its worker holds. The workers run under ``--processes 1``,
whose supervisor starts a fresh process each time one dies; the fresh one recovers what the dead
one held once its heartbeat lapses.
"""

from __future__ import annotations

import re

import pytest
from chaos_support import DEADLINE, Fleet, register, wait_until

from helpers import Project
from hurtle import TaskFailed

MAX_RECOVERIES = 2
MAX_RUNS = MAX_RECOVERIES + 1
#: What the dead letter's reason must speak of: its worker died while running it.
REASON = re.compile(r"die|dead|crash|lost|kill|exit|heartbeat|recover", re.IGNORECASE)


def test_a_task_that_kills_its_process_becomes_a_dead_letter_after_bounded_deliveries(
    project: Project, fleet: Fleet, broker: str
) -> None:
    project.send("chaos.poison", "poison")
    supervisor = fleet.start(
        "worker",
        "tasks:app",
        "--processes",
        "1",
        "--burst",
        HURTLE_MAX_RECOVERIES=str(MAX_RECOVERIES),
    )

    def runs() -> int:
        return project.lines("start").count("poison")

    def dead() -> int:
        return project.stats()["dead"]

    # Either it is dead-lettered, or it ran more often than the bound allows (fail at once).
    wait_until(lambda: dead() > 0 or runs() > MAX_RUNS, "a dead letter", timeout=2 * DEADLINE)
    ran = runs()
    assert ran <= MAX_RUNS, f"ran {ran} times and is still not a dead letter; at most {MAX_RUNS}"
    code = fleet.wait(supervisor)  # burst: the queue is empty once the message is dead
    assert code == 0, project.output(supervisor)[-3000:]
    assert runs() == ran, f"ran again after it became a dead letter ({runs()} runs)"
    assert project.stats() == {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 1}
    [letter] = project.app.broker.dead_letters("default")
    message = letter.message()
    assert message is not None and message.args == ("poison",)
    assert REASON.search(letter.reason), letter.reason


def test_with_max_recoveries_1_a_poison_alone_runs_twice_and_ends_its_handle_and_its_lock(
    project: Project, fleet: Fleet, broker: str
) -> None:
    """``HURTLE_MAX_RECOVERIES=1``: one death survived, the second (held alone) is the last.
    The dead letter ends what waits on it: the handle of a task that keeps results raises
    ``TaskFailed`` at once, and the same call of a unique task sent again runs."""
    tasks = register(project)
    fleet.start("worker", "tasks:app", "--processes", "1", HURTLE_MAX_RECOVERIES="1")

    kept = tasks["chaos.kept"].send("kept", "crash")
    with pytest.raises(TaskFailed) as info:
        kept.result(timeout=2 * DEADLINE)
    assert info.value.type == "WorkerLost", info.value
    assert info.value.message == "its worker died 2 times while holding it (max_recoveries is 1)"
    assert project.lines("start").count("kept") == 2
    assert kept.state() == "dead"

    once = tasks["chaos.once"]
    first = once.send("once", "crash")
    assert once.send("once", "crash").id == first.id  # held while it waits or runs
    wait_until(lambda: project.stats()["dead"] == 2, "the unique call's dead letter")
    assert project.lines("start").count("once") == 2
    again = once.send("once", "crash")
    assert again.id != first.id  # the lock ended with the dead letter
    wait_until(lambda: project.lines("start").count("once") > 2, "the call sent again to run")
