"""Every field's value against the type its annotation declares: the type check of Backend and Settings
(``check_field_types``), and the wording of what a key expected and what it got, which TOML job files share."""

from __future__ import annotations

import re
import types
import typing
from dataclasses import fields
from typing import Any

from .errors import ConfigError

__all__ = ["check_field_types", "conforms", "describe_type", "show_value"]

# Why a check driven by the dataclass fields rather than pydantic or msgspec: the annotations already say every
# type, and the frozen dataclasses stay plain dataclasses (``replace``, ``fields``, ``public``, the library's
# ``Settings(...)``) with no second schema to keep in step. pydantic is here only as openai's dependency (not ours
# to lean on), coerces by default ("false" -> False, 2.0 -> 2) unless every model is made strict, costs a noticeable
# import on every CLI start and words its errors over several lines; msgspec is not installed. What is needed is a
# few kinds (bool, int, float, str, None, tuple/list of them), a one-line message naming the key, and no coercion:
# well under a hundred lines. A field whose annotation uses a kind not handled here fails loudly (TypeError), and
# tests/core/test_settings_types.py checks every field of Settings.

_KINDS: dict[Any, str] = {
    bool: "true or false (a bool)",
    int: "a whole number (an int)",
    float: "a number (a float)",
    str: "text (a str)",
    type(None): "None (not set)",
}


_HINTS: dict[type, dict[str, Any]] = {}


def _field_types(cls: type) -> dict[str, Any]:
    """The evaluated annotations of a dataclass (strings under ``from __future__ import annotations``), once."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def conforms(value: Any, tp: Any) -> bool:
    """``value`` is of type ``tp``, without coercion: a bool is not an int, a str is not a bool, an int is a float.
    The kinds handled: bool, int, float, str, None, Any, unions, tuple/list (a tuple field takes a list) and dict."""
    if tp is Any:
        return True
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if origin in (tuple, list):  # a TOML array, a JSON list or a tuple: the same sequence
        if not isinstance(value, tuple | list):
            return False
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            return all(conforms(x, args[0]) for x in value)
        return len(value) == len(args) and all(conforms(x, a) for x, a in zip(value, args, strict=True))
    if origin is dict:  # a TOML table
        return isinstance(value, dict) and all(conforms(k, args[0]) and conforms(v, args[1])
                                               for k, v in value.items())
    raise TypeError(f"check_field_types does not handle the annotation {tp!r}")


def describe_type(tp: Any) -> str:
    if tp in _KINDS:
        return _KINDS[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe_type(a) for a in args)
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return f"a list of {_item(args[0])}"
    if origin is tuple:
        return f"a list of {len(args)}: {', '.join(_item(a) for a in args)}"
    return repr(tp)


def _item(tp: Any) -> str:
    """An item type as a list's description names it: "str", "str or table"."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_item(a) for a in typing.get_args(tp))
    if tp is dict or origin is dict:
        return "table"
    return getattr(tp, "__name__", repr(tp))


def show_value(value: Any, secret: bool) -> str:
    """A wrong value as a message shows it: its repr, shortened, credentials in URLs hidden; a secret only by type."""
    kind = type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    if secret:
        return f"a value hidden here ({article} {kind})"
    text = re.sub(r"://[^/@\s'\"]*@", "://***@", repr(value))
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({article} {kind})"


def check_field_types(obj: Any, label: str) -> None:
    """Each field of the dataclass ``obj`` holds the type its annotation declares, else a one-line ConfigError
    naming the field, the value and what was expected. A list given for a tuple field becomes that tuple (the
    dataclasses are frozen and hashable). Fields with ``repr=False`` (keys, credentials) are never shown."""
    hints = _field_types(type(obj))
    for f in fields(obj):
        value = getattr(obj, f.name)
        tp = hints[f.name]
        if not conforms(value, tp):
            raise ConfigError(f"{label} {f.name!r}: expected {describe_type(tp)}, got {show_value(value, not f.repr)}")
        if isinstance(value, list) and typing.get_origin(tp) is not list:
            object.__setattr__(obj, f.name, tuple(value))
