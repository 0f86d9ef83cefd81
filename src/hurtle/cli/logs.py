"""How the ``hurtle`` command logs: ``--log-level``, ``--log-format text|json`` and
``--log-config FILE``, accepted before or after the subcommand.

``text`` (the default) writes ``time LEVEL logger: message`` lines to stderr. ``json`` writes one
JSON object per line: ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, then the
fields a record carries (a worker's call and summary lines carry theirs, ``worker/log.py``),
and ``exception`` when there is one. ``--log-config`` hands a ``logging.config.dictConfig``
file (JSON; YAML when the name ends in ``.yaml``/``.yml`` and PyYAML is installed) the whole
setup instead: its levels, handlers and formatters (``hurtle.cli.logs.JsonFormatter`` among
them) replace those of ``--log-level`` and ``--log-format``. Its ``disable_existing_loggers``
defaults to false: hurtle's loggers exist before the file is read, and stay on unless it says.
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.config
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

LEVEL_HELP = (
    "DEBUG, INFO, WARNING or ERROR (default: INFO). A worker logs at INFO its app, broker and "
    "start and stop, and what it ran: a line per call while calls are few, a summary of the "
    "last --log-interval seconds under load; at WARNING, retried calls and what could not "
    "reach the broker; at ERROR, dead letters and what failed for good; at DEBUG also one "
    "line per fetched batch. Other commands log at INFO what they did, and their errors"
)


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"invalid level {text!r}: choose from {', '.join(LOG_LEVELS)}"
        )
    return level


def add_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """The logging options; ``top`` for the main parser (with defaults), else a subcommand's
    (unset unless given there: the main parser's value stands)."""
    unset: Any = argparse.SUPPRESS
    parser.add_argument(
        "--log-level",
        type=_log_level,
        default="INFO" if top else unset,
        metavar="LEVEL",
        help=LEVEL_HELP,
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text" if top else unset,
        help="text lines (default), or one JSON object per line with time, level, logger, "
        "message and a call's fields",
    )
    parser.add_argument(
        "--log-config",
        type=Path,
        default=None if top else unset,
        metavar="FILE",
        help="a logging.config.dictConfig file (JSON, or YAML with PyYAML) that sets up "
        "logging instead of --log-level and --log-format",
    )


def setup(args: argparse.Namespace) -> None:
    """Set up logging as the options say (``ConfigurationError`` for a bad config file)."""
    if args.log_config is not None:
        configure_from(args.log_config)
        return
    handler = logging.StreamHandler(sys.stderr)
    json_lines = args.log_format == "json"
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=getattr(logging, args.log_level), handlers=[handler])


def configure_from(path: Path) -> None:
    """Apply the ``dictConfig`` file at ``path``."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigurationError(f"--log-config {str(path)!r}: cannot read it ({err})") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigurationError(
                f"--log-config {str(path)!r} is YAML, which needs PyYAML: pip install pyyaml, "
                "or write the file as JSON"
            ) from None
        try:
            config = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigurationError(
                f"--log-config {str(path)!r} is not valid YAML: {err}"
            ) from None
    else:
        try:
            config = json.loads(text)
        except ValueError as err:
            raise ConfigurationError(
                f"--log-config {str(path)!r} is not valid JSON ({err}); a YAML file must be "
                "named .yaml or .yml"
            ) from None
    if not isinstance(config, dict):
        raise ConfigurationError(
            f"--log-config {str(path)!r} holds a {type(config).__name__}, not a "
            'logging.config.dictConfig mapping (with "version": 1)'
        )
    # hurtle's own loggers exist before the file is read: left on unless the file says
    config.setdefault("disable_existing_loggers", False)
    try:
        logging.config.dictConfig(config)
    except (ValueError, TypeError, AttributeError, ImportError) as err:
        raise ConfigurationError(
            f"--log-config {str(path)!r} is not a configuration logging accepts: {err}"
        ) from None


#: The attributes every ``LogRecord`` has: what is not among them was passed in ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the record's ``fields`` (a
    worker's call or summary), any other ``extra`` values, and the exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key in _STANDARD or key in out:
                continue
            if key == "fields" and isinstance(value, dict):
                for name, field in value.items():
                    out.setdefault(name, field)
            else:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, default=str, ensure_ascii=False)
