"""The layers of ``docs/architecture.md``, held against the code.

Every import a module under ``src/hurtle`` makes at run time — at the top of the module or inside
a function — goes to its own layer or below, or is one of the upward imports the page lists by
name; and no run-time imports form a loop, whatever the layers. Imports under
``if TYPE_CHECKING:`` are type references: they are free. The layers and the listed exceptions
are read from the page's tables, so the page is the rule and this is its check.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
SRC = ROOT / "src"


class Import(NamedTuple):
    """One run-time import: ``importer`` (a file of the tree, at ``line``) imports ``imported``."""

    path: Path
    line: int
    importer: str
    imported: str


class Layers(NamedTuple):
    """The page's tables: layer number -> its name, module pattern -> layer number, and the
    upward imports allowed, ``(importer pattern, imported pattern) -> why``. A pattern ending
    in ``/`` is a package and all it holds; any other names one module."""

    names: dict[int, str]
    patterns: dict[str, int]
    allowed: dict[tuple[str, str], str]


_ROW = re.compile(r"^\|(.*)\|\s*$")
_NAME = re.compile(r"`([^`]+)`")


def _cells(line: str) -> list[str] | None:
    m = _ROW.match(line.strip())
    return None if m is None else [c.strip() for c in m.group(1).split("|")]


def read_layers(text: str) -> Layers:
    """The layers and the allowed upward imports, from the two tables of the page."""
    names: dict[int, str] = {}
    patterns: dict[str, int] = {}
    allowed: dict[tuple[str, str], str] = {}
    table = ""
    for line in text.splitlines():
        cells = _cells(line)
        if cells is None:
            table = ""
            continue
        if cells[:2] == ["layer", "name"]:
            table = "layers"
        elif cells[:2] == ["importer", "imported"]:
            table = "allowed"
        elif table == "layers" and cells[0].isdigit():
            layer = int(cells[0])
            names[layer] = cells[1]
            for name in _NAME.findall(cells[2]):
                assert name not in patterns, f"{name} is in two layers of {ARCHITECTURE.name}"
                patterns[name] = layer
        elif table == "allowed" and len(cells) >= 3 and cells[0].startswith("`"):
            allowed[(_NAME.findall(cells[0])[0], _NAME.findall(cells[1])[0])] = cells[2]
    assert names, f"no layer table found in {ARCHITECTURE}"
    return Layers(names, patterns, allowed)


def matches(pattern: str, module: str) -> bool:
    """Whether ``module`` (dotted, from ``hurtle``) is what ``pattern`` names."""
    if pattern == "hurtle":
        return module == "hurtle"
    dotted = "hurtle." + pattern.rstrip("/").replace("/", ".")
    if pattern.endswith("/"):
        return module == dotted or module.startswith(dotted + ".")
    return module == dotted


def layer_of(layers: Layers, module: str) -> tuple[int, str] | None:
    """The layer of ``module`` and the pattern that places it (the longest that matches)."""
    found = [(len(p), p) for p in layers.patterns if matches(p, module)]
    if not found:
        return None
    pattern = max(found)[1]
    return layers.patterns[pattern], pattern


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node``, function bodies included, but not what runs only for type
    checkers (the body of ``if TYPE_CHECKING:``; its ``else`` runs)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _statements(other)
            continue
        yield child
        yield from _statements(child)


def runtime_imports(src: Path) -> tuple[set[str], list[Import]]:
    """The modules of the ``hurtle`` package under ``src``, and every import of a ``hurtle``
    module that one of them makes at run time."""
    files = {module_name(p, src): p for p in sorted((src / "hurtle").rglob("*.py"))}
    found: list[Import] = []
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        for node in _statements(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                # ``from . import x`` imports the module ``x`` when there is one
                targets = [
                    f"{source}.{a.name}" if f"{source}.{a.name}" in files else source
                    for a in node.names
                ]
            else:
                continue
            for target in dict.fromkeys(targets):
                if (target == "hurtle" or target.startswith("hurtle.")) and target != module:
                    found.append(Import(path, node.lineno, module, target))
    return set(files), found


def layer_problems(layers: Layers, modules: set[str], imports: list[Import]) -> list[str]:
    """One line per module in no layer and per run-time import that goes up without leave."""
    problems = [
        f"{m} is in no layer: add it to the table of docs/architecture.md"
        for m in sorted(modules)
        if layer_of(layers, m) is None
    ]
    for imp in imports:
        low, high = layer_of(layers, imp.importer), layer_of(layers, imp.imported)
        if low is None or high is None or high[0] <= low[0]:
            continue
        if any(matches(a, imp.importer) and matches(b, imp.imported) for a, b in layers.allowed):
            continue
        problems.append(
            f"{_where(imp)}: {imp.importer} (layer {low[0]}, {layers.names[low[0]]}) imports "
            f"{imp.imported} (layer {high[0]}, {layers.names[high[0]]}) at run time: a module "
            "imports only its own layer or below (docs/architecture.md); import a type under "
            "TYPE_CHECKING, move what both sides need down, or hand a callable down"
        )
    return problems


def _where(imp: Import) -> str:
    try:
        return f"{imp.path.relative_to(ROOT)}:{imp.line}"
    except ValueError:
        return f"{imp.path}:{imp.line}"


def cycles(imports: list[Import]) -> list[list[Import]]:
    """One loop of run-time imports (as the imports that make it) per group of modules that
    import each other, found with Tarjan's strongly connected components."""
    edges: dict[str, dict[str, Import]] = defaultdict(dict)
    for imp in imports:
        edges[imp.importer].setdefault(imp.imported, imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # recursion is as deep as the longest import chain: shallow
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(set(edges)):
        if v not in index:
            visit(v)
    loops = []
    for group in groups:
        start = min(group)
        # the shortest way back to ``start`` inside the group (breadth first)
        came: dict[str, Import] = {}
        frontier = [start]
        while frontier and start not in came:
            following = []
            for v in frontier:
                for w, imp in sorted(edges[v].items()):
                    if w in group and w not in came:
                        came[w] = imp
                        following.append(w)
            frontier = following
        loop, at = [], start
        while True:
            imp = came[at]
            loop.append(imp)
            at = imp.importer
            if at == start:
                break
        loops.append(loop[::-1])
    return loops


def cycle_problems(imports: list[Import]) -> list[str]:
    return [
        "run-time imports form a loop: "
        + "; ".join(f"{_where(i)}: {i.importer} imports {i.imported}" for i in loop)
        for loop in cycles(imports)
    ]


# -- the tree as it is ---------------------------------------------------------------------------


def test_every_run_time_import_goes_to_its_own_layer_or_below() -> None:
    layers = read_layers(ARCHITECTURE.read_text())
    modules, imports = runtime_imports(SRC)
    assert imports, "no import found: the check reads nothing"
    problems = layer_problems(layers, modules, imports)
    assert not problems, "\n".join(problems)


def test_no_run_time_imports_form_a_loop() -> None:
    _, imports = runtime_imports(SRC)
    problems = cycle_problems(imports)
    assert not problems, "\n".join(problems)


def test_every_listed_exception_is_still_needed() -> None:
    layers = read_layers(ARCHITECTURE.read_text())
    _, imports = runtime_imports(SRC)
    for a, b in layers.allowed:
        assert any(matches(a, i.importer) and matches(b, i.imported) for i in imports), (
            f"docs/architecture.md allows {a} to import {b}, and nothing does: strike the row"
        )


# -- the check itself, on a small tree of its own -------------------------------------------------

PAGE = """
| layer | name | modules | may import |
| --- | --- | --- | --- |
| 0 | bottom | `errors` | nothing |
| 1 | middle | `brokers/` | the bottom |
| 2 | top | `app` `hurtle` | anything |

| importer | imported | why |
| --- | --- | --- |
| `errors` | `app` | a test of the exceptions |
"""


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in {"__init__.py": "", **files}.items():
        path = tmp_path / "hurtle" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_check_names_the_file_the_line_and_the_rule_of_an_upward_import(
    tmp_path: Path,
) -> None:
    src = _tree(
        tmp_path,
        {
            "errors.py": "",
            "app.py": "from .brokers.memory import X\n",
            "brokers/__init__.py": "",
            "brokers/memory.py": "X = 1\n\ndef f():\n    from ..app import Y\n",
        },
    )
    problems = layer_problems(read_layers(PAGE), *runtime_imports(src))
    assert len(problems) == 1, problems
    assert (
        "brokers/memory.py:4: hurtle.brokers.memory (layer 1, middle) imports hurtle.app"
        in (problems[0])
    )
    assert "(layer 2, top) at run time" in problems[0]


def test_type_checking_imports_and_listed_exceptions_are_free(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "errors.py": "def f():\n    from . import app\n",
            "app.py": "",
            "brokers/__init__.py": (
                "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..app import A\n"
            ),
        },
    )
    assert layer_problems(read_layers(PAGE), *runtime_imports(src)) == []


def test_the_check_names_a_module_in_no_layer(tmp_path: Path) -> None:
    src = _tree(tmp_path, {"errors.py": "", "app.py": "", "stray.py": ""})
    assert layer_problems(read_layers(PAGE), *runtime_imports(src)) == [
        "hurtle.stray is in no layer: add it to the table of docs/architecture.md"
    ]


def test_the_check_names_a_loop_even_within_a_layer(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "brokers/__init__.py": "",
            "brokers/a.py": "from .b import x\n",
            "brokers/b.py": "def x():\n    from . import a\n",
        },
    )
    _, imports = runtime_imports(src)
    problems = cycle_problems(imports)
    assert len(problems) == 1, problems
    assert "a.py:1: hurtle.brokers.a imports hurtle.brokers.b" in problems[0]
    assert "b.py:2: hurtle.brokers.b imports hurtle.brokers.a" in problems[0]
