"""The OpenAPI document of the dashboard's JSON API, written by hand (``/api/openapi.json``).

``tests/dashboard/test_dashboard_api.py`` checks every route of the app is here and every
answer matches its schema; ``test_dashboard_schemathesis.py`` sends generated requests to every
operation and checks the answers against it. Besides its own answers, every operation may
answer 401 (no or a wrong access token) and 503 (the broker failed), every change 403 (a
cross-site request, or a cookie without its CSRF token), every request with a body 413 (too
large) and every one that names a queue 400 (a name the brokers refuse): ``_add_common`` adds
those to each.
"""

from __future__ import annotations

from typing import Any

from ..names import MAX_QUEUE_NAME, MAX_TASK_NAME, QUEUE_NAME_RULE


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _ok(schema: dict[str, Any], status: str = "200", text: str = "OK") -> dict[str, Any]:
    return {status: {"description": text, "content": {"application/json": {"schema": schema}}}}


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def _get(summary: str, schema: dict[str, Any]) -> dict[str, Any]:
    """A path with one GET answering 200 with ``schema``."""
    return {"get": {"summary": summary, "responses": _ok(schema)}}


_ERROR = {"description": "Refused", "content": {"application/json": {"schema": _ref("Error")}}}
_QUEUE = {
    "name": "queue",
    "in": "path",
    "required": True,
    "description": QUEUE_NAME_RULE,
    "schema": {"type": "string", "pattern": f"^[A-Za-z0-9._:-]{{1,{MAX_QUEUE_NAME}}}$"},
}
_INT = {"type": "integer"}
#: The attempt a message was on, as every reason text counts it.
_ATTEMPT = {
    "type": "integer",
    "minimum": 1,
    "description": "the attempt the message was on: 1 for its first (a message that never "
    "ran, expired or cancelled, was on its first)",
}
_NUM = {"type": "number"}
_STR = {"type": "string"}
_COUNTS = {kind: _INT for kind in ("processed", "failed", "retried", "dead_lettered")}


def _obj(props: dict[str, Any], nullable: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "required": sorted(props),
        "properties": {
            k: ({"anyOf": [v, {"type": "null"}]} if k in nullable else v) for k, v in props.items()
        },
    }


_SELECTION = {
    "oneOf": [
        _obj({"ids": _array(_STR)}),
        _obj({"all": {"type": "boolean", "enum": [True]}}),
    ]
}


def _on_selection(summary: str, counted: str) -> dict[str, Any]:
    """A path with one POST acting on a selection of a queue's dead letters (``_SELECTION``),
    answering how many it ``counted``."""
    return {
        "post": {
            "summary": summary,
            "parameters": [_QUEUE],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _SELECTION}},
            },
            "responses": {**_ok(_obj({counted: _INT})), "400": _ERROR},
        }
    }


_MESSAGE_IN = {
    "type": "object",
    "required": ["task"],
    "additionalProperties": False,
    "properties": {
        "task": {"type": "string", "minLength": 1, "maxLength": MAX_TASK_NAME},
        "args": {"type": "array"},
        "kwargs": {"type": "object"},
        "priority": {"type": "integer", "minimum": 0, "maximum": 9},
        "eta": {"type": "number", "minimum": 0},
    },
}

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "hurtle dashboard API", "version": "1"},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": _obj({"error": _STR}),
            "Queue": _obj(
                {
                    "name": _STR,
                    "ready": _INT,
                    "delayed": _INT,
                    "in_flight": _INT,
                    "dead": _INT,
                    "paused": {"type": "boolean"},
                }
            ),
            "Paused": _obj({"queue": _STR, "paused": {"type": "boolean"}}),
            "Point": _obj({"t": _NUM, "processed": _NUM, "failed": _NUM, "totals": _ref("Counts")}),
            "Counts": _obj(_COUNTS),
            "TaskCounts": _obj({"queue": _STR, "task": _STR, **_COUNTS}),
            "Worker": _obj(
                {
                    "id": _STR,
                    "host": _STR,
                    "pid": _INT,
                    "pool": _STR,
                    "concurrency": _INT,
                    "queues": _array(_STR),
                    "started_at": _NUM,
                    "last_heartbeat": _NUM,
                    "deadline": _NUM,
                    "running": _INT,
                    **_COUNTS,
                }
            ),
            "TaskLookup": _obj(
                {
                    "id": _STR,
                    "state": {
                        "type": "string",
                        "enum": [
                            "unknown",
                            "pending",
                            "running",
                            "succeeded",
                            "failed",
                            "dead",
                            "expired",
                            "cancelled",
                            "superseded",
                        ],
                    },
                    "source": {"type": "string", "enum": ["result", "dead_letter"]},
                    "task": _STR,
                    "queue": _STR,
                    "attempt": _ATTEMPT,
                    "args": {"type": "array"},
                    "kwargs": {"type": "object"},
                    "result": {},
                    "error": _obj({"type": _STR, "message": _STR, "traceback": _STR}),
                    "enqueued_at": _NUM,
                    "started_at": _NUM,
                    "finished_at": _NUM,
                    "keeps_result": {"type": "boolean"},
                    "dead_letter_id": _STR,
                    "progress": _obj({"fraction": _NUM, "message": _STR, "at": _NUM}),
                    "note": _STR,
                },
                nullable=(
                    "source",
                    "task",
                    "queue",
                    "attempt",
                    "args",
                    "kwargs",
                    "error",
                    "enqueued_at",
                    "started_at",
                    "finished_at",
                    "keeps_result",
                    "dead_letter_id",
                    "progress",
                ),
            ),
            "Schedule": _obj(
                {
                    "name": _STR,
                    "task": _STR,
                    "queue": _STR,
                    "cron": _STR,
                    "every": _NUM,
                    "tz": _STR,
                    "when": _STR,
                    "catch_up": {"type": "boolean"},
                    "last_run": _NUM,
                    "next_run": _NUM,
                },
                nullable=("cron", "every", "last_run"),
            ),
            "Delayed": _obj(
                {
                    "queue": _STR,
                    "delayed": _INT,
                    "listed": {"type": "boolean"},
                    "next": _array(
                        _obj({"eta": _NUM, "id": _STR, "task": _STR}, nullable=("id", "task"))
                    ),
                }
            ),
            "DeadLetter": _obj(
                {
                    "id": _STR,
                    "queue": _STR,
                    "reason": _STR,
                    "traceback": _STR,
                    "failed_at": _NUM,
                    "message_id": _STR,
                    "task": _STR,
                    "attempt": _ATTEMPT,
                    "args": {"type": "array"},
                    "kwargs": {"type": "object"},
                    "arguments": _STR,
                    "undecodable": _STR,
                    "size": _INT,
                },
                nullable=(
                    "message_id",
                    "task",
                    "attempt",
                    "args",
                    "kwargs",
                    "arguments",
                    "undecodable",
                ),
            ),
            "Overview": _obj(
                {
                    "broker": _STR,
                    "time": _NUM,
                    "totals": _ref("Counts"),
                    "throughput": _ref("Point"),
                    "workers_alive": _INT,
                    "queues": _array(_ref("Queue")),
                }
            ),
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/api/": {
            "get": {
                "summary": "The API's index: a redirect to this document",
                "responses": {"307": {"description": "Location: /api/openapi.json"}},
            }
        },
        "/api/overview": _get("Totals, throughput, queue depths, workers alive", _ref("Overview")),
        "/api/throughput": _get(
            "Recent throughput points (tasks per second)",
            _obj({"every": _NUM, "points": _array(_ref("Point"))}),
        ),
        "/api/throughput/stream": {
            "get": {
                "summary": "Throughput points as server-sent events (event: throughput)",
                "responses": {
                    "200": {
                        "description": "An event stream",
                        "content": {"text/event-stream": {"schema": _STR}},
                    }
                },
            }
        },
        "/api/queues": _get("Messages per queue and state", _array(_ref("Queue"))),
        "/api/tasks": _get("The cluster's counters per queue and task", _array(_ref("TaskCounts"))),
        "/api/tasks/{id}": {
            "get": {
                "summary": "Look a message up by id: state, arguments, result or error, timings",
                "description": (
                    "From the record a task that keeps results stores at each outcome, else "
                    "from the message's dead letter. With neither, the state is unknown and "
                    "note says why that may be (waiting or running: records are written at "
                    "the outcome; a task that keeps no result; an expired record)."
                ),
                "parameters": [
                    {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {**_ok(_ref("TaskLookup")), "400": _ERROR},
            }
        },
        "/api/schedules": {
            "get": {
                "summary": "Periodic tasks: when, last run (from the broker), next run",
                "description": "known is false when the dashboard was made from a broker, "
                "not an app: schedules live in the app's code.",
                "responses": _ok(
                    _obj(
                        {
                            "time": _NUM,
                            "known": {"type": "boolean"},
                            "schedules": _array(_ref("Schedule")),
                        }
                    )
                ),
            }
        },
        "/api/delayed": {
            "get": {
                "summary": "Delayed messages per queue, and the next few ETAs where listed",
                "description": "listed is false when the broker cannot list delayed messages "
                "cheaply: then only their count is known.",
                "responses": _ok(_array(_ref("Delayed"))),
            }
        },
        "/api/workers": _get("Live workers, as of their last heartbeat", _array(_ref("Worker"))),
        "/api/queues/{queue}/messages": {
            "post": {
                "summary": "Enqueue one message or a list of them; answers with their ids",
                "parameters": [_QUEUE],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "oneOf": [
                                    _MESSAGE_IN,
                                    {"type": "array", "items": _MESSAGE_IN, "minItems": 1},
                                ],
                            }
                        }
                    },
                },
                "responses": {
                    **_ok(
                        {
                            "type": "object",
                            "required": ["ids"],
                            "properties": {"id": _STR, "ids": _array(_STR)},
                        },
                        "201",
                        "Enqueued",
                    ),
                    "400": _ERROR,
                },
            },
            "delete": {
                "summary": "Purge a queue: drop its waiting messages (ready and delayed)",
                "description": "Messages workers hold (in flight) finish as usual; dead "
                "letters stay. purged is how many messages were dropped.",
                "parameters": [_QUEUE],
                "responses": {**_ok(_obj({"purged": _INT})), "400": _ERROR},
            },
        },
        "/api/queues/{queue}/pause": {
            "post": {
                "summary": "Pause a queue: no worker fetches from it until it is resumed",
                "description": "Tasks already fetched finish; workers started later see the "
                "pause too (it lives in the broker).",
                "parameters": [_QUEUE],
                "responses": {**_ok(_ref("Paused")), "400": _ERROR},
            }
        },
        "/api/queues/{queue}/resume": {
            "post": {
                "summary": "Resume a paused queue: workers fetch from it again",
                "parameters": [_QUEUE],
                "responses": {**_ok(_ref("Paused")), "400": _ERROR},
            }
        },
        "/api/queues/{queue}/dead": {
            "get": {
                "summary": "Dead letters of a queue, oldest first",
                "parameters": [
                    _QUEUE,
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 500},
                    },
                    {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                ],
                "responses": {
                    **_ok(_array(_ref("DeadLetter"))),
                    "400": _ERROR,
                },
            },
            "delete": {
                "summary": "Purge every dead letter of a queue",
                "parameters": [_QUEUE],
                "responses": {**_ok(_obj({"purged": _INT})), "400": _ERROR},
            },
        },
        "/api/queues/{queue}/dead/retry": _on_selection(
            "Put dead letters back in their queue (a selection, or all)", "retried"
        ),
        "/api/queues/{queue}/dead/delete": _on_selection(
            "Delete dead letters (a selection, or all)", "deleted"
        ),
    },
}


def _error(text: str) -> dict[str, Any]:
    return {"description": text, "content": {"application/json": {"schema": _ref("Error")}}}


_COMMON = {
    "401": _error("No access token, or a wrong one"),
    "503": _error("The broker failed; nothing was changed"),
}
_CHANGE = {"403": _error("A cross-site request, or a session cookie without its CSRF token")}
_BODY = {"413": _error("The request body is too large")}


def _add_common(doc: dict[str, Any]) -> None:
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            common = {**_COMMON, **(_CHANGE if method != "get" else {})}
            if "requestBody" in operation:
                common.update(_BODY)
            if "{queue}" in path:
                common["400"] = _error("A queue name the brokers refuse, or a bad request")
            operation["responses"] = {**common, **operation["responses"]}


_add_common(OPENAPI)
