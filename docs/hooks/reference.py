"""mkdocs hook: reference tables generated from hurtle's own code, so they cannot drift from it.

* ``<!-- hurtle-cli-reference -->``: one section per command and subcommand, with the help text
  ``hurtle ... --help`` prints;
* ``<!-- hurtle-settings-reference -->``: every field of ``hurtle.settings.Settings`` with its
  environment variable, default and the comment above it in the source.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
from typing import Any

CLI = "<!-- hurtle-cli-reference -->"
SETTINGS = "<!-- hurtle-settings-reference -->"


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _commands(child, (*path, name))
    return found


def cli_reference() -> str:
    """The command-line reference as Markdown."""
    os.environ["COLUMNS"] = "100"  # argparse wraps help at the terminal's width
    from hurtle.cli import build_parser

    parts = []
    for path, parser in _commands(build_parser(), ("hurtle",)):
        depth = min(len(path) + 1, 4)
        parts.append(f"{'#' * depth} `{' '.join(path)}`\n\n```text\n{parser.format_help()}```\n")
    return "\n".join(parts)


def settings_reference() -> str:
    """A table of every setting: variable, default, meaning (the ``#:`` comment above it)."""
    from hurtle import settings

    source = inspect.getsource(settings.Settings).splitlines()
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in source:
        text = line.strip()
        if text.startswith("#:"):
            pending.append(text[2:].strip())
            continue
        field = re.match(r"(\w+):", text)
        if field and pending:
            comments[field.group(1)] = " ".join(pending)
        pending = []
    rows = ["| setting | environment | default | meaning |", "| --- | --- | --- | --- |"]
    for field in dataclasses.fields(settings.Settings):
        default = field.default
        shown = f"`{default!r}`" if not isinstance(default, str) else f"`{default}`"
        meaning = comments.get(field.name, "").replace("|", "\\|")
        rows.append(f"| `{field.name}` | `HURTLE_{field.name.upper()}` | {shown} | {meaning} |")
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, **_: Any) -> str:
    if CLI in markdown:
        markdown = markdown.replace(CLI, cli_reference())
    if SETTINGS in markdown:
        markdown = markdown.replace(SETTINGS, settings_reference())
    return markdown
