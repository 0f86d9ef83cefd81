"""Workflows given as a graph of dependencies: ``app.graph({"b": ["a"], "c": ["a"], "d": ["b",
"c"]}, a=fetch.s(url), b=resize.s(), c=thumb.s(), d=publish.s())``.

Each node is a signature, named; the mapping says which nodes each one waits for. A node that
waits for none starts when the graph is sent, with its own arguments; one that waits for one
node gets that node's result before its own arguments; one that waits for several gets the list
of their results, in the order its dependencies are listed. The graph's result is a dict of the
results of the nodes nothing waits for, by name; every node's own result is kept too
(``GraphHandle.node``).

It holds as chords do (``hurtle.workflows``): every message's header says, when the graph is
sent, what its result sets off — the dependents that wait for it alone are sent with its
acknowledgement, and it is counted, in the same atomic step, as one member of the chord of a
dependent that waits for several (whose last member sends it). A node that several such
dependents wait for is counted in one of their chords itself and sends a ``hurtle.collect``
message for each other one, which passes its result on and is counted there. Every message
names the graph's id: a node that fails for good fails the graph at once, and no node that
waits for it runs. A graph with a cycle, a name it does not define, or a dependency listed twice
is refused when it is built (``ConfigurationError``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from .errors import ConfigurationError
from .flow import COLLECT, Flow, Link, Step
from .handles import GraphHandle
from .nesting import Build, Join
from .signature import Signature, check_member
from .workflows import publish_workflow

if TYPE_CHECKING:
    from .app import Hurtle


def _order(after: dict[str, tuple[str, ...]]) -> list[str]:
    """The nodes with each one after those it waits for; ``ConfigurationError`` naming a
    cycle if there is one."""
    done: list[str] = []
    state: dict[str, int] = {}  # 1: being visited, 2: done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = [*path[path.index(name) :], name]
            raise ConfigurationError(f"the graph has a cycle: {' -> '.join(reversed(cycle))}")
        state[name] = 1
        for dep in after[name]:
            visit(dep, [*path, name])
        state[name] = 2
        done.append(name)

    for name in after:
        visit(name, [])
    return done


class graph:
    """A graph of named signatures and what each waits for; ``.send()`` returns its
    ``GraphHandle`` (see the module's docstring)."""

    def __init__(self, after: Mapping[str, Iterable[str]], /, **nodes: Signature[Any]) -> None:
        if not nodes:
            raise ConfigurationError("a graph needs at least one node: graph(after, a=add.s(1, 2))")
        for name, sig in nodes.items():
            if not isinstance(sig, Signature):
                raise ConfigurationError(
                    f"graph node {name!r} must be a signature such as add.s(1, 2), got "
                    f"{type(sig).__name__}"
                )
            check_member(sig.task)
        deps = {name: tuple(after.get(name, ())) for name in nodes}
        for name in after:
            if name not in nodes:
                raise ConfigurationError(f"the graph's dependencies name {name!r}, not a node")
        for name, waits in deps.items():
            for dep in waits:
                if dep not in nodes:
                    raise ConfigurationError(f"node {name!r} waits for {dep!r}, not a node")
            if len(set(waits)) != len(waits):
                raise ConfigurationError(f"node {name!r} lists a dependency twice: {waits}")
        self.nodes = dict(nodes)
        self.after = deps
        self.order = _order(deps)
        for name, sig in nodes.items():
            sig._check(min(len(deps[name]), 1))
        waited = {dep for waits in deps.values() for dep in waits}
        #: The nodes nothing waits for, in the order given: their results are the graph's.
        self.sinks = tuple(name for name in nodes if name not in waited)
        apps = {sig.task.app for sig in nodes.values()}
        if len(apps) > 1:
            raise ConfigurationError(
                "the nodes of a graph belong to one app: it runs on one broker"
            )
        self.app: Hurtle = apps.pop()

    def send(self, *, connection: object = None) -> GraphHandle:
        """Send the graph: the nodes that wait for nothing; with ``connection``, in that
        connection's transaction (``Task.options``)."""
        app, after, nodes, sinks = self.app, self.after, self.nodes, self.sinks
        build = Build(app)
        root = build.root
        links: dict[str, Link] = {}
        for name, sig in nodes.items():
            last = len(sinks) == 1 and name == sinks[0]
            links[name] = sig._link(min(len(after[name]), 1), root if last else None)
        joins: dict[str, list[Join]] = {name: [] for name in nodes}
        if len(sinks) > 1:  # their results gathered in order by one hurtle.collect
            final = build.collect(links[sinks[0]].queue, None)
            gather = Flow(id=root, store=app.settings.result_ttl, gather=root, gathers=len(sinks))
            for place, sink in enumerate(sinks):
                joins[sink].append(Join(root, place, len(sinks), final, gather))
        flows: dict[str, Flow] = {}
        for name in reversed(self.order):  # each node after every node that waits for it
            steps: list[Step] = []
            for other, waits in after.items():
                if name not in waits:
                    continue
                if len(waits) == 1:
                    steps.append(Step(links[other], flows[other]))
                else:
                    cb = links[other]
                    then = msgspec.structs.replace(flows[other], gather=cb.id, gathers=len(waits))
                    joins[name].append(Join(cb.id, waits.index(name), len(waits), cb, then))
            counted = joins[name][0] if joins[name] else None  # counted in its chord itself
            for join in joins[name][1:]:  # a relay per chord beyond the first
                steps.append(Step(build.collect(links[name].queue, join), build.header(join)))
            flow = build.header(counted, nodes[name].task.result_ttl)
            flows[name] = msgspec.structs.replace(flow, steps=tuple(steps)) if steps else flow
        starts = [links[n].message((), flows[n], app.keyring) for n in nodes if not after[n]]
        publish_workflow(app, starts, connection)
        name = nodes[sinks[0]].task.name if len(sinks) == 1 else COLLECT
        return GraphHandle(
            root,
            app,
            None,
            name,
            (*(link.id for link in links.values()), *build.ids),
            sinks=sinks,
            ids={n: link.id for n, link in links.items()},
            tasks={n: sig.task.name for n, sig in nodes.items()},
        )

    def delay(self) -> GraphHandle:
        """Send the graph (Celery's spelling)."""
        return self.send()

    def apply_async(self, *, connection: object = None) -> GraphHandle:
        """Send the graph (Celery's spelling); with ``connection``, as ``send`` does."""
        return self.send(connection=connection)


__all__ = ["GraphHandle", "graph"]
