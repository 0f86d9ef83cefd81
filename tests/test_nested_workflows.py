"""Workflows inside workflows, and graphs given as dependencies, run by a real worker in this
process on the memory broker (every broker runs them in ``tests/brokers/test_workflows_contract``;
SIGKILL trials in ``tests/chaos/test_chaos_dead_ends``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import workflow_app
from hurtle import ConfigurationError, Hurtle, TaskFailed, chain, chord, graph, group, new_key
from hurtle.flow import COLLECT, FLOW, read_flow
from hurtle.message import Message


@pytest.fixture
def app() -> Hurtle:
    return workflow_app()


def run(app: Hurtle, pool: str = "solo") -> None:
    app.worker(burst=True, pool=pool, concurrency=4).run()


def tasks(app: Hurtle) -> tuple[Any, ...]:
    return tuple(app.tasks[n] for n in ("add", "mul", "total", "boom"))


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_every_shape_of_nesting_returns_its_result(app: Hurtle, pool: str) -> None:
    add, mul, total, _ = tasks(app)
    shapes = {
        # 3 -> [13, 6] -> 19
        "chain of a group": (chain(add.s(1, 2), group(add.s(10), mul.s(2)), total.s()), 19),
        "chain ending in a group": (chain(add.s(1, 2), group(add.s(10), mul.s(2))), [13, 6]),
        # 2 -> [3, 20] -> 23 -> 46
        "chord in a chain": (
            chain(add.s(1, 1), chord([add.s(1), mul.s(10)], total.s()), mul.s(2)),
            46,
        ),
        "group after a group": (
            chain(group(add.s(1, 1), add.s(2, 2)), group(total.s(), total.s(100))),
            [6, 106],
        ),
        # member 0 is a chord of 2, the outer chord has 3: the two counts differ
        "chord in a chord": (
            chord(
                [chord([add.s(1, 1), add.s(2, 2)], total.s()), add.s(3, 3), add.s(4, 4)], total.s()
            ),
            20,
        ),
        "chain in a chain in a chord": (
            chord([chain(add.s(1, 1), chain(mul.s(2), add.s(1)))], total.s(offset=1)),
            6,
        ),
    }
    handles = {name: (w.send(), expected) for name, (w, expected) in shapes.items()}
    nested_group = group(chain(add.s(1, 1), mul.s(3)), group(add.s(1, 1), add.s(2, 2)), add.s(5, 5))
    g = nested_group.send()
    run(app, pool)
    got = {name: h.result(timeout=5) for name, (h, _) in handles.items()}
    assert got == {name: expected for name, (_, expected) in handles.items()}
    assert g.result(timeout=5) == [6, [2, 4], 10]


def test_arguments_given_when_sent_go_to_the_first_step_of_a_nested_workflow(app: Hurtle) -> None:
    add, _, total, _ = tasks(app)
    h = chain(group(add.s(1), add.s(2)), total.s()).delay(10)  # [11, 12] -> 23
    g = group(chain(add.s(1), add.s(1)), chord([add.s(5)], total.s())).delay(1)  # [3, 6]
    run(app)
    assert (h.result(timeout=5), g.result(timeout=5)) == (23, [3, 6])


def test_a_member_failing_deep_inside_fails_the_whole_at_once_and_nothing_after_it_runs(
    app: Hurtle,
) -> None:
    add, mul, total, boom = tasks(app)
    h = chain(add.s(1, 1), group(add.s(1), chain(boom.s(), add.s(1))), total.s(), mul.s(2)).send()
    run(app)
    with pytest.raises(TaskFailed) as info:
        h.result(timeout=5)
    assert (info.value.task, info.value.type, info.value.message) == (
        "boom",
        "ValueError",
        "boom 2",
    )
    assert app.calls == []  # type: ignore[attr-defined]
    stats = app.broker.stats(["default"])["default"]
    assert (stats.ready, stats.dead) == (0, 1)


def test_a_cancelled_nested_workflow_ends_cancelled_and_none_of_it_runs(app: Hurtle) -> None:
    add, _, total, _ = tasks(app)
    h = chain(add.s(1, 1), group(add.s(1), add.s(2)), total.s()).send()
    app.cancel(h)
    run(app)
    with pytest.raises(TaskFailed) as info:
        h.result(timeout=5)
    assert (info.value.type, h.state()) == ("Cancelled", "cancelled")
    assert app.calls == []  # type: ignore[attr-defined]


def test_each_message_names_the_whole_and_says_what_its_result_sets_off(app: Hurtle) -> None:
    add, mul, total, _ = tasks(app)
    h = chain(add.s(1, 2), group(add.s(10), mul.s(2)), total.s()).send()
    [raw] = app.broker.consumer(["default"]).fetch(10, 0)
    first = Message.decode(raw.raw)
    flow = read_flow(first)
    assert flow.id == h.id and not flow.chord
    assert [s.link.task for s in flow.steps] == ["add", "mul"]  # the group after it
    for place, step in enumerate(flow.steps):
        assert (step.flow.id, step.flow.chord, step.flow.index, step.flow.total) == (
            h.id,
            h.id,
            place,
            2,
        )
        callback, then = step.flow.callback, step.flow.then
        assert callback is not None and then is not None
        assert (callback.task, callback.id, then.gather, then.gathers) == ("total", h.id, h.id, 2)
    assert FLOW in first.headers and first.args == (1, 2)


def test_a_group_whose_results_nothing_takes_is_gathered_by_hurtle_collect(app: Hurtle) -> None:
    add, mul, _, _ = tasks(app)
    assert COLLECT not in app.tasks  # registered on first use only
    h = chain(add.s(1, 2), group(add.s(10), mul.s(2))).send()
    assert COLLECT in app.tasks and h.id in h.members
    run(app)
    assert h.result(timeout=5) == [13, 6]


def test_a_graph_runs_each_node_after_those_it_waits_for(app: Hurtle) -> None:
    add, mul, total, _ = tasks(app)
    diamond = app.graph(
        {"b": ["a"], "c": ["a"], "d": ["b", "c"]},
        a=add.s(1, 2),
        b=add.s(10),
        c=mul.s(2),
        d=total.s(),
    )
    # a and b are both waited for by c and d (b counted in one chord, relayed to the other);
    # three nodes nothing waits for
    wide = graph(
        {"c": ["a", "b"], "d": ["b", "a"], "e": ["a"]},
        a=add.s(1, 1),
        b=add.s(2, 2),
        c=total.s(),
        d=total.s(100),
        e=mul.s(5),
    ).send()
    lone = app.graph({}, only=add.s(4, 5))
    run(app)
    assert diamond.result(timeout=5) == {"d": 19}
    assert [diamond.node(n).result(timeout=5) for n in "abc"] == [3, 13, 6]
    assert wide.result(timeout=5) == {"c": 6, "d": 106, "e": 10}
    assert lone.result(timeout=5) == {"only": 9}
    # each joining node got its dependencies' results in the order it lists them
    assert sorted(app.calls) == [[2, 4], [4, 2], [13, 6]]  # type: ignore[attr-defined]


def test_a_node_that_fails_fails_the_graph_and_what_waits_for_it_never_runs(app: Hurtle) -> None:
    add, _, total, boom = tasks(app)
    h = app.graph(
        {"b": ["a"], "c": ["a"], "d": ["b", "c"]},
        a=add.s(1, 2),
        b=boom.s(),
        c=add.s(1),
        d=total.s(),
    )
    run(app)
    with pytest.raises(TaskFailed) as info:
        h.result(timeout=5)
    assert (info.value.task, info.value.message) == ("boom", "boom 3")
    assert h.node("c").result(timeout=5) == 4  # it did not wait for b
    assert app.calls == []  # type: ignore[attr-defined]
    with pytest.raises(TaskFailed) as never:  # d never runs: the graph's failure, not
        h.node("d").result(timeout=30)  # a ResultTimeout after waiting
    assert (never.value.task, never.value.message) == ("boom", "boom 3")


def test_graphs_that_cannot_run_are_refused_when_built(app: Hurtle) -> None:
    add, _, total, _ = tasks(app)
    refused = {
        "the graph has a cycle: a -> b -> c -> a": lambda: graph(
            {"a": ["c"], "b": ["a"], "c": ["b"]}, a=add.s(1), b=add.s(1), c=add.s(1)
        ),
        "node 'b' waits for 'x', not a node": lambda: graph({"b": ["x"]}, b=add.s(1)),
        "name 'z', not a node": lambda: graph({"z": ["a"]}, a=add.s(1, 1)),
        "lists a dependency twice": lambda: graph({"b": ["a", "a"]}, a=add.s(1, 1), b=total.s()),
        "at least one node": lambda: graph({}),
        "must be a signature": lambda: graph({}, a=chain(add.s(1, 1))),  # type: ignore[arg-type]
        "do not fit": lambda: graph({"b": ["a"]}, a=add.s(1, 1), b=add.s(1, 2)),
    }
    for message, build in refused.items():
        with pytest.raises(ConfigurationError, match=message):
            build()
    assert app.broker.stats(["default"])["default"].ready == 0


def test_encrypted_results_stay_sealed_where_a_nested_workflow_gathers_them(
    tmp_path: Path,
) -> None:
    """A group's results gathered by ``hurtle.collect`` in an app with keys: the SQLite file
    never holds them, or the arguments, in plain text."""
    app = Hurtle(f"sqlite:///{tmp_path}/q.db", encryption_keys=[new_key()])

    @app.task(name="shout", encrypt=True)
    def shout(text: str, mark: str = "!") -> str:
        return text.upper() + mark

    try:
        h = chain(shout.s("whisper-one"), group(shout.s(), shout.s(mark="?"))).send()
        run(app)
        assert h.result(timeout=10) == ["WHISPER-ONE!!", "WHISPER-ONE!?"]
        stored = b"".join(p.read_bytes() for p in tmp_path.iterdir())
        assert stored and b"WHISPER" not in stored and b"whisper" not in stored
    finally:
        app.close()


def test_nested_workflows_and_graphs_complete_at_the_send_in_eager_mode(app: Hurtle) -> None:
    from hurtle.testing import eager

    add, mul, total, _ = tasks(app)
    with eager(app):
        h = chain(add.s(1, 2), group(add.s(10), mul.s(2))).send()
        g = app.graph({"b": ["a"], "c": ["a", "b"]}, a=add.s(1, 1), b=mul.s(3), c=total.s())
        assert (h.result(timeout=0), g.result(timeout=0)) == ([13, 6], {"c": 8})
