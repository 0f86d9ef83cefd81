"""docs/testing.md runs: as a story (its Python blocks in order in one namespace, as the page says
a reader can), and as the test suite it describes (its blocks written to a conftest.py, a
tasks.py and a test module that pytest runs with the page's own plugin line)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "testing.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
FILE_COMMENT = re.compile(r"#\s*([\w/]+\.py)\s*$")

pytest_plugins = ["pytester"]


def blocks() -> list[tuple[str | None, str]]:
    """Each Python block of the page with the file it names in its first line, if any."""
    out = []
    for body in BLOCK.findall(PAGE.read_text()):
        named = FILE_COMMENT.fullmatch(body.splitlines()[0].strip())
        out.append((named.group(1) if named else None, body))
    return out


@pytest.fixture
def page_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HURTLE_BROKER_URL", "memory://")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("tasks", "conftest"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_the_page_runs_as_a_story(page_dir: Path) -> None:
    namespace: dict[str, Any] = {"__name__": "testing_page"}
    for name, body in blocks():
        if name is not None:
            (page_dir / name).write_text(body)
        exec(compile(body, f"{PAGE.name}:{name or 'block'}", "exec"), namespace)
    assert "test_the_same_on_sqlite" in namespace  # the page got to its last block
    for value in namespace.values():
        close = getattr(value, "close", None)
        if type(value).__name__ == "Hurtle" and close is not None:
            close()
    sys.modules.pop("tasks", None)


def test_the_page_is_a_test_suite_that_passes(pytester: pytest.Pytester) -> None:
    tests = []
    for name, body in blocks():
        if name is not None:
            pytester.path.joinpath(name).write_text(body)
        else:
            tests.append(body)
    pytester.path.joinpath("test_page.py").write_text("\n\n".join(tests))
    defined = sum(len(re.findall(r"^def test_", body, re.M)) for body in tests)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-W", "error")
    result.assert_outcomes(passed=defined)
    assert defined >= 10
