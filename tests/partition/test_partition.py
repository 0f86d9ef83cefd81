"""Hosts cut apart: Redis on one host, a worker on each of two others, the publisher on a fourth
(network namespaces, ``netns.py``). One worker is cut off from the others while it runs tasks,
for a random while, by a random kind of cut, at a random moment; then its link comes back.

The promises (docs/brokers.md, "Delivery semantics"):

* nothing is lost: every call whose publish returned runs;
* the cut worker's deliveries are recovered by the other once its heartbeat lapses, so every
  task that runs twice is one the cut worker held at the cut (the broker's record of what it
  held, read right after the cut);
* the outcome of a task whose worker was taken for dead meanwhile is ignored: once the link is
  back, the cut worker's late outcomes change nothing; the stored result of a task is the
  redelivered copy's;
* with a scheduler on each side (an ``every=1`` periodic task), every tick is enqueued once: no
  tick twice, and none lost. The claim rules lose a tick only when no scheduler that reaches
  the broker asks for it before the next tick is due (a scheduler that wakes late claims only
  the latest tick due): the scheduler on the healthy side claims every tick meanwhile;
* the dashboard on the cut side keeps answering: ``/api/overview`` answers (200 with what it
  knows, or 503) within ``OVERVIEW_BOUND`` seconds throughout, and shows the figures again once
  the link is back.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import time
from typing import Any

import pytest
from netns import CUTS
from partition_support import (
    DASHBOARD_PORT,
    DEADLINE,
    TRIALS,
    Site,
    Trial,
    trial_rng,
    wait_until,
)

pytestmark = [pytest.mark.partition, pytest.mark.timeout(240)]

#: Tasks per trial, published 10 at a time every 0.1 s, each taking 0.1 s.
TOTAL = 200
SECONDS = 0.1
#: Longest wait for an answer of the dashboard's ``/api/overview``, cut off or not.
OVERVIEW_BOUND = 10.0
POOLS = {"solo": ("--pool", "solo"), "threads": ("--pool", "threads", "--concurrency", "4")}


def done_count(site: Site) -> int:
    return sum(1 for r in site.runs() if r[0] == "done")


def unfinished(site: Site) -> int:
    """Runs started and not done yet (per task number and process)."""
    count: collections.Counter[tuple[str, str]] = collections.Counter()
    for r in site.runs():
        if r[0] == "start":
            count[r[1], r[2]] += 1
        elif r[0] == "done":
            count[r[1], r[2]] -= 1
    return sum(n for n in count.values() if n > 0)


def overview(site: Site) -> dict[str, Any]:
    """``/api/overview`` of the dashboard on ``w1``, asked from ``w1`` itself."""
    url = f"http://127.0.0.1:{DASHBOARD_PORT}/api/overview"
    return dict(site.agents["w1"].call("get", url=url, limit=OVERVIEW_BOUND))


def stop(site: Site, *procs: subprocess.Popen[str], signal_first: bool = True) -> None:
    """SIGTERM ``procs`` (unless not ``signal_first``); each must exit 0 (the cut worker too,
    its link back)."""
    for p in procs:
        if signal_first:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            code = p.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            p.kill()
            code = p.wait()
        assert code == 0, f"exit status {code}:\n{site.output(p)[-3000:]}"


def run_trial(site: Site, scenario: str, trial: int, ticks: bool) -> None:
    rng = trial_rng(scenario, trial)
    pool = rng.choice(sorted(POOLS))
    how = rng.choice(CUTS)
    # mostly longer than the heartbeat timeout (recovery), sometimes shorter
    seconds = rng.uniform(0.3, 1.5) if rng.random() < 0.2 else rng.uniform(3.0, 6.0)
    print(f"pool {pool}, cut {how!r} for {seconds:.2f}s")
    env = {"TICKS": "1"} if ticks else {}
    cut = site.start("w1", "worker", "tasks:app", *POOLS[pool], **env)
    other = site.start("w2", "worker", "tasks:app", *POOLS[pool], **env)
    pub = site.agents["pub"]
    pids = {str(cut.pid), str(other.pid)}
    wait_until(lambda: pids <= set(pub.call("workers")), "both workers to beat")
    dashboard = None
    if ticks:
        dashboard = site.start("w1", "dashboard", "tasks:app", "--port", str(DASHBOARD_PORT))
        wait_until(lambda: overview(site)["status"] == 200, "the dashboard to answer")
    pub.call("stream", total=TOTAL, chunk=10, pause=0.1, seconds=SECONDS, log=str(site.sent_log))

    # cut at a random moment of the work (and of the ticks)
    at = rng.randrange(5, TOTAL // 2)
    wait_until(lambda: done_count(site) >= at, f"{at} tasks done")
    if ticks:
        wait_until(lambda: len(tick_ids(site)) >= 2, "two ticks run")
    time.sleep(rng.uniform(0.0, SECONDS))
    site.net.cut(site.hosts["w1"], how)
    cut_at = time.monotonic()
    held = pub.call("held").get(str(cut.pid), {"numbers": [], "others": [], "alive": False})
    # read before the other worker could recover them, else the record is gone
    assert held["alive"], "the cut worker was taken for dead before its holdings were read"
    slowest = 0.0
    while time.monotonic() - cut_at < seconds:
        if dashboard is None:
            time.sleep(0.05)
            continue
        answer = overview(site)
        slowest = max(slowest, answer["elapsed"])
        assert answer["status"] in (200, 503), f"cut off, /api/overview answered {answer}"
    site.net.heal(site.hosts["w1"])
    healed = time.time()

    wait_until(lambda: set(site.sent()) <= done_numbers(site), "every task sent to be done")
    wait_until(
        lambda: pub.call("workers").get(str(cut.pid), 0) > healed,
        "the cut worker to report again once its link is back",
    )
    wait_until(lambda: unfinished(site) == 0, "the runs under way to end")
    wait_until(lambda: not any(pub.call("stats").values()), "the queue to be empty")
    if dashboard is not None:

        def recovered() -> bool:
            answer = overview(site)
            return answer["status"] == 200 and '"workers_alive":2' in answer["body"]

        wait_until(recovered, "the dashboard to show both workers again")
    stop(site, cut, other)
    if ticks:  # what the workers handed back at their stop runs now, without a scheduler
        drain = site.start("w2", "worker", "tasks:app", "--burst", "--no-scheduler", **env)
        stop(site, drain, signal_first=False)
    tally(site, scenario, how, seconds, other, held, slowest)


def done_numbers(site: Site) -> set[str]:
    return {r[1] for r in site.runs() if r[0] == "done"}


def tick_ids(site: Site) -> dict[float, set[str]]:
    """Tick -> the ids of the messages that ran for it."""
    out: dict[float, set[str]] = collections.defaultdict(set)
    for r in site.runs():
        if r[0] == "tick":
            out[float(r[1])].add(r[2])
    return out


def tally(
    site: Site,
    scenario: str,
    how: str,
    seconds: float,
    other: subprocess.Popen[str],
    held: dict[str, Any],
    slowest: float,
) -> None:
    """The trial's figures, saved; then its assertions. ``held``: what the broker counted as
    held by the cut worker right after the cut (``partition_agent.py``, ``held``)."""
    sent = site.sent()
    runs = collections.defaultdict(list)  # number, or tick message id -> pids of its runs
    for r in site.runs():
        if r[0] in ("done", "tick"):
            runs[r[1] if r[0] == "done" else r[2]].append(r[3] if r[0] == "tick" else r[2])
    held_ids = set(map(str, held["numbers"])) | set(held["others"])
    duplicates = {k for k, pids in runs.items() if len(pids) > 1}
    trial = Trial(
        scenario=scenario,
        cut=how,
        seconds=seconds,
        tasks=len(sent),
        lost=sorted(set(sent) - set(runs), key=int),
        duplicates=sum(len(pids) - 1 for pids in runs.values()),
        held_at_cut=len(held_ids),
        duplicates_outside=sorted(duplicates - held_ids),
        overview_slowest=slowest,
    )
    seen = tick_ids(site)
    if seen:
        first, last = min(seen), max(seen)
        trial.ticks = len(seen)
        trial.ticks_twice = sum(1 for ids in seen.values() if len(ids) > 1)
        trial.ticks_lost = sorted({first + i for i in range(round(last - first) + 1)} - set(seen))
    # The redelivered copy's outcome counts: where the other worker ran the copy (it never held a
    # stale one), the stored result must be its pid, whatever the cut worker reported late.
    results = site.agents["pub"].call("results", ids=list(sent.values()))
    redelivered = [n for n in sent if n in duplicates and runs[n].count(str(other.pid)) == 1]
    replaced = sorted((n for n in redelivered if results[sent[n]] != other.pid), key=int)
    trial.results_replaced = len(replaced)
    trial.save()
    print(trial)
    assert not site.unsure(), "the publisher, never cut off, failed to publish"
    assert not trial.lost, f"lost: {trial.lost}"
    assert set(runs) >= set(sent) and set(sent) >= {k for k in runs if k.isdigit()}
    assert not trial.duplicates_outside, (
        f"ran twice though the cut worker did not hold them at the cut: "
        f"{trial.duplicates_outside} (it held {sorted(held_ids)})"
    )
    twice = {t: ids for t, ids in seen.items() if len(ids) > 1}
    assert not twice, f"ticks enqueued more than once: {twice}"
    assert not trial.ticks_lost, f"ticks lost: {trial.ticks_lost}"
    missing = sorted((n for n in sent if results[sent[n]] is None), key=int)
    assert not missing, f"no result stored for {missing}"
    assert not replaced, (
        f"the cut worker's late outcomes replaced the redelivered copies' results of {replaced}"
    )


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_worker_cut_off_loses_nothing_and_only_its_batch_runs_twice(
    site: Site, trial: int
) -> None:
    run_trial(site, "worker cut off from Redis", trial, ticks=False)


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_scheduler_cut_off_enqueues_no_tick_twice_and_its_dashboard_answers(
    site: Site, trial: int
) -> None:
    run_trial(site, "worker, scheduler and dashboard cut off", trial, ticks=True)
