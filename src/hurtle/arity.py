"""Which calls a function accepts (``Arity``), read once from its signature when a task is
registered, so that a send checks its arguments with a few compares instead of binding them."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ConfigurationError

#: Call shapes (positional count, keyword names) whose verdict an ``Arity`` remembers.
_MAX_SHAPES = 256


class Arity:
    """Which calls a function accepts, precomputed once, for a cheap check at send time."""

    __slots__ = (
        "bare_max",
        "bare_min",
        "keywords",
        "max_positional",
        "positional",
        "required",
        "required_keywords",
        "required_positional_only",
        "shapes",
        "signature",
        "var_keyword",
    )

    def __init__(self, signature: inspect.Signature) -> None:
        kinds = inspect.Parameter
        params = list(signature.parameters.values())
        positional = [
            p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        ]
        self.signature = signature
        #: names of the positional parameters, in order
        self.positional = [p.name for p in positional]
        self.required = sum(1 for p in positional if p.default is p.empty)
        #: required parameters that only a position can fill
        self.required_positional_only = sum(
            1 for p in positional if p.default is p.empty and p.kind is kinds.POSITIONAL_ONLY
        )
        self.max_positional = (
            sys.maxsize if any(p.kind is kinds.VAR_POSITIONAL for p in params) else len(positional)
        )
        self.keywords = frozenset(
            p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
        )
        self.required_keywords = frozenset(
            p.name for p in params if p.kind is kinds.KEYWORD_ONLY and p.default is p.empty
        )
        self.var_keyword = any(p.kind is kinds.VAR_KEYWORD for p in params)
        # a call without keywords fits when bare_min <= len(args) <= bare_max
        self.bare_min = self.required
        self.bare_max = -1 if self.required_keywords else self.max_positional
        #: (positional count, *keyword names) -> whether such a call fits
        self.shapes: dict[tuple[Any, ...], bool] = {}

    def fits(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        n = len(args)
        if not kwargs:
            return self.bare_min <= n <= self.bare_max
        shape = (n, *kwargs)  # calls in a batch mostly share their shape: decide once per shape
        known = self.shapes.get(shape)
        if known is None:
            known = self._fits(n, kwargs)
            if len(self.shapes) < _MAX_SHAPES:
                self.shapes[shape] = known
        return known

    def _fits(self, n: int, kwargs: Mapping[str, Any]) -> bool:
        if n > self.max_positional:
            return False
        taken = self.positional[:n]
        for name in kwargs:
            if name in self.keywords:
                if name in taken:
                    return False
            elif not self.var_keyword:
                return False
        if n < self.required and (
            n < self.required_positional_only
            or any(name not in kwargs for name in self.positional[n : self.required])
        ):
            return False
        return self.required_keywords.issubset(kwargs)

    def problem(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """Why a call does not fit, in Python's own words."""
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as err:
            return str(err)
        return "the arguments do not fit"

    def text(self) -> str:
        """The signature without annotations: ``(x, y=0, *, z)``."""
        return str(
            self.signature.replace(
                parameters=[
                    p.replace(annotation=p.empty) for p in self.signature.parameters.values()
                ],
                return_annotation=inspect.Signature.empty,
            )
        )


def arity_of(fn: Callable[..., Any]) -> Arity | None:
    try:
        return Arity(inspect.signature(fn))
    except (TypeError, ValueError):  # some builtins have no signature: nothing to check
        return None


def parameter_of(task: str, fn: Callable[..., Any], name: str, option: str) -> tuple[int, Any]:
    """The position of the parameter ``name`` of ``fn`` (-1 for a keyword-only one) and its
    default (None for none), for a task option that names a parameter (``debounce_key=``,
    ``fair_key=``); ``ConfigurationError`` when ``fn`` has no such parameter."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"task {task!r}: {option}={name!r} names a parameter, but the function's "
            "signature cannot be read: give a callable of its arguments instead"
        ) from None
    kinds = inspect.Parameter
    param = params.get(name)
    if param is None or param.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD):
        named = ", ".join(
            p for p, v in params.items() if v.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
        )
        raise ConfigurationError(
            f"task {task!r}: {option}={name!r} is not one of its parameters "
            f"({named or 'it has none'}): name one, or give a callable of its arguments"
        )
    default = None if param.default is param.empty else param.default
    if param.kind is kinds.KEYWORD_ONLY:
        return -1, default
    return list(params).index(name), default


_NO_VALUE = object()


class CallKey:
    """A key made of a call's arguments, as a task option gives it (``debounce_key=``,
    ``fair_key=``): the name of one of the task's parameters (its value is the key), or a
    callable of its arguments returning the key; None, no key. Used as text (``str(value)``),
    hashed with ``keyed`` for a task whose arguments are sealed (set by the task)."""

    __slots__ = ("_default", "_fn", "_index", "_name", "keyed")

    def __init__(
        self,
        task: str,
        fn: Callable[..., Any],
        key: object,
        option: str,
        example: str,
        required: bool = False,
    ) -> None:
        self._fn: Callable[..., Any] | None = None
        self._name: str | None = None
        self._index = -1
        self._default: Any = None
        self.keyed: Callable[[bytes], str] | None = None
        if key is None and not required:
            return
        if isinstance(key, str):
            self._name = key
            self._index, self._default = parameter_of(task, fn, key, option)
        elif callable(key):
            self._fn = key
        else:
            raise ConfigurationError(
                f"task {task!r}: {option} must be the name of one of its parameters "
                f"({option}={example!r}) or a callable of its arguments returning a key "
                f"(lambda {example}, *a, **k: {example}), got {key!r:.60} ({type(key).__name__})"
            )

    @property
    def keys_calls(self) -> bool:
        """Whether a key was given (a name or a callable)."""
        return self._fn is not None or self._name is not None

    def text_of(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """The key of a call with these arguments, as text (hashed with ``keyed`` if set);
        only when ``keys_calls``."""
        if self._fn is not None:
            value: Any = self._fn(*args, **kwargs)
        else:
            value = kwargs.get(self._name, _NO_VALUE)  # type: ignore[arg-type]
            if value is _NO_VALUE:  # positional, or left to its default
                value = args[self._index] if 0 <= self._index < len(args) else self._default
        text = str(value)
        return text if self.keyed is None else self.keyed(text.encode())
