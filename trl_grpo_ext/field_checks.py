"""One check for every field `GRPOConfig` adds to TRL's: what a field accepts follows from its type annotation and
the range its metadata declares (`Range`), so a new field gets its check by declaring it.

A value arriving as a string (a quoted YAML number, a dict built by hand from text) is converted as `TrlParser`
converts TRL's own fields on the command line: `int("3")`, `float("0.5")`, transformers' `string_to_bool` for
booleans ("true", "yes", "1", ...). A string that would not convert there is refused here ("2.5" for an integer).
Every refusal is a `ValueError` "<field> must be <what is allowed>, got <value>".

Kinds, by annotation:
    - `int`: an integer (Python's or numpy's; not a bool, not 2.5 nor 3.0), at least `Range.low`.
    - `float`: a finite real number (ints and numpy floats welcome) in the declared interval.
    - `bool`: True or False (or a string `string_to_bool` reads).
    - `str`: a string, one of `choices` in the field's metadata when it has them (as HfArgumentParser's).
    - `list[str]`: a list of mode names among `choices`, or one comma-separated string (`mode_list`).
    - `X | None`: None, or a value of kind X.

Each feature declares its part of the config in its own folder (`<feature>/config.py`) as a `ConfigPart`: its fields,
their ranges and modes, and the rules between them; `config.GRPOConfig` composes the parts.
"""

import argparse
import dataclasses
import math
import numbers
import textwrap
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from transformers.hf_argparser import string_to_bool

INT64_MAX = 2**63 - 1  # integer fields end up in tensors, step counters and seeds


@dataclass(frozen=True)
class Range:
    """The numbers a field accepts: [low, high], an end left out when open (`low_open`, `high_open`) and unbounded
    when None; from `whole_from` on, only whole numbers (a step count or a fraction below it). For an integer field
    only `low` is used."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    whole_from: float | None = None

    def holds(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        whole = self.whole_from is None or value < self.whole_from or float(value).is_integer()
        return above and below and whole

    def text(self) -> str:
        """'in (0, 1]', '>= 0', 'in (0, 10] (a whole number from 1)' or '' (unbounded)."""
        low, high = _number(self.low), _number(self.high)
        if self.whole_from is not None:
            return (
                f"{Range(self.low, self.high, self.low_open, self.high_open).text()} (a whole number from "
                f"{_number(self.whole_from)})"
            )
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {low}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {high}"
        return ""


def _number(x: float | None) -> str:
    """1000000 rather than 1e+06, 0.5 as 0.5."""
    return "" if x is None else str(int(x)) if float(x).is_integer() else f"{x:g}"


def _kind(annotation) -> tuple[type, bool]:
    """(the base type, whether None is allowed) of an annotation such as `int`, `float | None`, `list[str]`."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _kind(args[0])[0], True
    return (typing.get_origin(annotation) or annotation), False


def allowed(annotation, spec: Range | None, choices) -> str:
    """What a field accepts, in words, as the error message says it."""
    base, optional = _kind(annotation)
    bounds = spec.text() if spec is not None else ""
    if base is bool:
        text = "true or false"
    elif base is int:
        text = "an integer" + (f" {bounds}" if bounds else "")
    elif base is float:
        text = "a finite number" + (f" {bounds}" if bounds else "")
    elif choices:
        text = f"one of {list(choices)}"
    else:
        text = "a non-empty string"
    return text + (", or None" if optional else "")


def check_field(name: str, value, annotation, spec: Range | None = None, choices=None):
    """`value` of field `name` converted to the field's kind, or a ValueError.

    Args:
        name: the field's name, for the message.
        value: what the config holds.
        annotation: the field's type annotation (`int`, `float | None`, `bool`, `str`, `list[str]`, ...).
        spec: the declared range of a number field.
        choices: the names a `str` or `list[str]` field accepts.

    Returns:
        The value, converted (a string to a number or bool; a list field to a list of modes).

    Raises:
        ValueError: "<name> must be <allowed>, got <value!r>" (the list messages of `mode_list`).
    """
    base, optional = _kind(annotation)
    if base is list:
        return mode_list(name, value, tuple(choices or ()))
    if value is None and optional:
        return None
    converted = _convert(value, base)
    if not _fits(converted, base, spec, choices):
        shown = repr(value)
        shown = shown if len(shown) <= 40 else f"{shown[:20]}...{shown[-10:]} ({len(shown)} characters)"
        limit = " of at most 2**63 - 1" if base is int and converted is not None and abs(converted) > INT64_MAX else ""
        raise ValueError(f"{name} must be {allowed(annotation, spec, choices)}{limit}, got {shown}")
    return converted


def _fits(converted, base: type, spec: Range | None, choices) -> bool:
    """Whether a converted value (None: it did not convert) is one the field takes."""
    if converted is None or (choices and converted not in choices):
        return False
    if base is int:
        return abs(converted) <= INT64_MAX and (spec is None or spec.holds(converted))
    if base is float:
        return math.isfinite(converted) and (spec is None or spec.holds(converted))
    return True


def _convert(value, base: type):
    """`value` as a `base` (int, float, bool or str) the way TrlParser reads the command line, or None."""
    if isinstance(value, str) and base is not str:
        try:
            return string_to_bool(value) if base is bool else base(value.strip())
        except (ValueError, argparse.ArgumentTypeError):  # what argparse reports as "invalid int value"
            return None
    if base is bool:
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if base is int:  # Python and numpy integers (numbers.Integral), not 3.0
        return int(value) if isinstance(value, numbers.Integral) else None
    if base is float:  # any real number: int, float, numpy's floats, Fraction
        try:
            return float(value) if isinstance(value, numbers.Real) else None
        except OverflowError:  # an int of hundreds of digits
            return math.inf
    return value if isinstance(value, str) and value.strip() else None


def mode_list(name: str, value, choices: tuple[str, ...]) -> list[str]:
    """`value` (a list, or a comma-separated string from a YAML or the command line, whose parser gives a list of such
    strings) as a list of modes.

    Raises:
        ValueError: not a string or a list of strings, or an unknown or repeated mode, naming the field.
    """
    items = [value] if isinstance(value, str) else value if isinstance(value, list | tuple) else None
    if items is None or not all(isinstance(item, str) for item in items):
        raise ValueError(
            f"{name} must be a list of modes among {list(choices)} or a comma-separated string, got {value!r}"
        )
    modes = [mode.strip() for item in items for mode in item.split(",") if mode.strip()]
    for mode in modes:
        if mode not in choices:
            raise ValueError(f"{name} entries must be among {list(choices)}, got {mode!r}")
    if len(set(modes)) != len(modes):
        raise ValueError(f"{name} lists a mode twice: {modes}")
    return modes


def check_declarations(fields, ranges: dict[str, Range], modes: dict[str, tuple[str, ...]], hints=None) -> None:
    """Every int or float field has a declared `Range`, every list field its modes, and nothing is declared for a
    field that does not exist: checked when `config` is imported, so a new field cannot go unchecked. `hints`: each
    field's annotation resolved (`typing.get_type_hints`: also string annotations, `from __future__ import
    annotations`); without it, each field's `type`.

    Raises:
        TypeError: naming the field that lacks a declaration, or the declaration that names no field.
    """
    names = {f.name for f in fields}
    for f in fields:
        annotation = hints[f.name] if hints else f.type  # f.type: at import, before HfArgumentParser rewrites it
        base, _ = _kind(annotation)
        if base in (int, float) and f.name not in ranges:
            raise TypeError(f"GRPOConfig field {f.name!r} ({f.type}) has no declared range in FIELD_RANGES")
        if base is list and f.name not in modes:
            raise TypeError(f"GRPOConfig field {f.name!r} ({f.type}) has no declared modes in FIELD_MODES")
    unknown = sorted((set(ranges) | set(modes)) - names)
    if unknown:
        raise TypeError(f"FIELD_RANGES/FIELD_MODES declare fields GRPOConfig does not have: {unknown}")


# Every `ConfigPart` by its fields class, recorded when the part is made (in its feature's `config.py`): a config
# class's parts are those of the fields classes among its bases (`config_parts`).
CONFIG_PARTS: dict[type, "ConfigPart"] = {}


def config_parts(config_class: type) -> tuple["ConfigPart", ...]:
    """The parts of `config_class` (`GRPOConfig`, or a user's subclass that adds a feature's fields class as a base):
    the `ConfigPart` of each fields class in its method resolution order, in the order dataclasses collect their
    fields (the last base first), so in the order of its docstring sections."""
    return tuple(CONFIG_PARTS[cls] for cls in reversed(config_class.__mro__) if cls in CONFIG_PARTS)


@dataclass(frozen=True)
class ConfigPart:
    """One feature's part of `GRPOConfig`, declared in the feature's folder (`<feature>/config.py`): `GRPOConfig`
    names `fields` among its bases, and so inherits its fields, checks each of them by its type and declaration
    (`check_field`), then runs `checks` (`config_parts` finds the part from the base).

    Attributes:
        fields: a dataclass mixin whose fields (each with a default and `metadata={"help": ...}`) `GRPOConfig`
            adds to TRL's, and whose docstring is the feature's `> Parameters that control ...` section of
            `GRPOConfig`'s docstring (`section`), written as a class docstring.
        ranges: the `Range` of each int or float field.
        modes: the modes each list field takes (a registry, read when a config is checked).
        checks: the rules between fields (this feature's, and with TRL's), in order: `check(args) -> None` raising a
            ValueError that names the fields and values. `args` may be a TRL config given the fields by
            `GRPOConfig.add_defaults`, so a check reads fields only.

    Raises:
        TypeError: when declared, an int or float field without a range, a list field without modes, or a range or
            modes naming no field (`check_declarations`).
    """

    fields: type
    ranges: Mapping[str, Range] = dataclasses.field(default_factory=dict)
    modes: Mapping[str, typing.Any] = dataclasses.field(default_factory=dict)
    checks: tuple[Callable[[typing.Any], None], ...] = ()

    def __post_init__(self):
        check_declarations(dataclasses.fields(self.fields), self.ranges, self.modes, self.hints())
        CONFIG_PARTS[self.fields] = self

    def hints(self) -> dict:
        """Each field's annotation, resolved (`typing.get_type_hints`), so that a fields class written with
        `from __future__ import annotations` (strings) or inheriting fields is read as one with plain annotations;
        not `Field.type`, which HfArgumentParser rewrites in place."""
        return typing.get_type_hints(self.fields)

    def section(self, indent: str = " " * 8) -> str:
        """The docstring of `fields`, dedented and then indented by `indent` (as under `Parameters:` of
        `GRPOConfig`'s docstring), without its leading and trailing blank lines."""
        return textwrap.indent(textwrap.dedent(self.fields.__doc__).strip("\n"), indent)

    def check_fields(self, args) -> None:
        """Each field of `fields` on `args` checked by its type and declaration, and replaced by its converted value
        (`check_field`). Raises ValueError naming the field."""
        hints = self.hints()
        for f in dataclasses.fields(self.fields):
            choices = f.metadata.get("choices") or self.modes.get(f.name)
            annotation = hints[f.name]
            value = check_field(f.name, getattr(args, f.name), annotation, self.ranges.get(f.name), choices)
            setattr(args, f.name, value)
