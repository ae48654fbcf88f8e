"""Options declared once: a field of a frozen settings dataclass that is also a CLI flag and an
environment variable.

A field made with ``option(default, parse, help, metavar)`` is one option: its flag is its name
with dashes (``--max-body-bytes``), its variable the settings' prefix and its name in capitals
(``LLMOBS_MAX_BODY_BYTES``), its default the field's. ``options_of`` lists them for the parser
and ``--help``, so the flag, the variable, the default and the help cannot drift apart.
Precedence: flag > environment > default; a bad value fails at start-up naming the flag or
variable it came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llmobs.config.checks import Check

_OPTION = "llmobs.option"  # the key of a field's option in its metadata


class ConfigError(ValueError):
    """A configuration value is invalid; the message names its source."""


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not true or false (also: 1/0, yes/no, on/off)")


def parse_size(text: str) -> int:
    """Parse a byte size: plain bytes or with a KiB/MiB/GiB (or k/m/g) suffix."""
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    cleaned = text.strip().lower().removesuffix("ib").removesuffix("b")
    if cleaned and cleaned[-1] in units:
        return int(float(cleaned[:-1]) * units[cleaned[-1]])
    return int(cleaned)


_SI = {"k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12, "p": 1e15}


def parse_quantity(text: str) -> float:
    """A number with an optional SI suffix: k, M, G (or B, billions), T, P: 8B, 3.35T, 989e12."""
    cleaned = text.strip().lower().replace("_", "")
    if cleaned and cleaned[-1] in _SI:
        return float(cleaned[:-1]) * _SI[cleaned[-1]]
    return float(cleaned)


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


DURATION_FORMS = "give seconds (2.5) or a number with a unit: 500ms, 2s, 5m, 1h, 28d, 1w"


def parse_duration(text: str) -> float:
    """Seconds from a number with an optional unit, as Prometheus spells one: 500ms, 2s,
    1.5, 5m, 6h, 28d, 1w (no unit: seconds)."""
    cleaned = text.strip().lower()
    value, scale = cleaned, 1.0
    for unit in ("ms", "s", "m", "h", "d", "w"):
        if cleaned.endswith(unit) and cleaned[: -len(unit)].strip():
            value, scale = cleaned[: -len(unit)], _DURATION_UNITS[unit]
            break
    try:
        seconds = float(value) * scale
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is not a duration: {DURATION_FORMS}")
    return seconds


def format_duration(seconds: float) -> str:
    """A duration as people write it and ``parse_duration`` reads it: 28d, 6h, 5m, 2s, 100ms."""
    for unit in ("d", "h", "m", "s", "ms"):
        count = seconds / _DURATION_UNITS[unit]
        if count >= 1 and abs(count - round(count)) < 1e-9:
            return f"{round(count)}{unit}"
    return f"{seconds:g}s"


def format_size(size: int) -> str:
    """A byte size as people write it and ``parse_size`` reads it: 16MiB, 1GiB, 300."""
    for suffix, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{suffix}"
    return str(size)


def parse_list(text: str) -> tuple[str, ...]:
    """A comma-separated list (empty entries dropped)."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


@dataclass(frozen=True)
class _Spec:
    parse: Callable[[str], Any]
    help: str
    metavar: str
    check: Check | None


def option(
    default: Any,
    parse: Callable[[str], Any],
    help: str,
    metavar: str = "",
    *,
    check: Check | None = None,
    secret: bool = False,
) -> Any:
    """A settings field that is an option; ``check``: what a valid value is
    (``llmobs.config.checks``); ``secret``: kept out of ``repr`` (a token)."""
    spec = _Spec(parse, help, metavar, check)
    return field(default=default, repr=not secret, metadata={_OPTION: spec})


@dataclass(frozen=True)
class Option:
    """One option as the parser and the docs see it."""

    field: str
    flag: str
    env: str
    parse: Callable[[str], Any]
    help: str
    metavar: str
    default: Any
    check: Check | None = None


def options_of(settings: type[Any], env_prefix: str) -> tuple[Option, ...]:
    """The options of a settings dataclass, in the order of its fields."""
    out = []
    for f in dataclasses.fields(settings):
        spec = f.metadata.get(_OPTION)
        if isinstance(spec, _Spec):
            flag = "--" + f.name.replace("_", "-")
            env = env_prefix + f.name.upper()
            out.append(
                Option(
                    f.name, flag, env, spec.parse, spec.help, spec.metavar, f.default, spec.check
                )
            )
    return tuple(out)


def merge_sources(
    options: tuple[Option, ...], environ: Mapping[str, str], flags: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Values given by flag (not None) or environment, converted; defaults are the caller's."""
    flags = flags or {}
    values: dict[str, Any] = {}
    for opt in options:
        given = flags.get(opt.field)
        if given is not None:
            values[opt.field] = _convert(opt, given, opt.flag)
        elif opt.env in environ:
            values[opt.field] = _convert(opt, environ[opt.env], opt.env)
    return values


# what a value of each of Python's own types must look like: their own errors are Python's
# words ("invalid literal for int() with base 10"), not a user's
_FORMS: dict[Callable[[str], Any], str] = {
    int: "a whole number, e.g. 8080",
    float: "a number, e.g. 0.5",
    parse_size: "a size in bytes, with an optional KiB, MiB or GiB (16MiB)",
    parse_quantity: "a number with an optional k, M, G (or B), T or P (8B, 3.35T)",
}


def _convert(opt: Option, raw: Any, source: str) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return opt.parse(raw)
    except (TypeError, ValueError) as exc:
        form = _FORMS.get(opt.parse)
        why = f"{raw!r} is not {form}" if form is not None else str(exc)
        raise ConfigError(f"{source}: {why}") from None


def check_fields(settings: object, options: tuple[Option, ...]) -> None:
    """Run each option's check on its value (an unset one, None, is not checked); the first
    problem found is a ``ConfigError`` naming the flag and the variable."""
    for opt in options:
        value = getattr(settings, opt.field)
        if opt.check is None or value is None:
            continue
        problem = opt.check(value)
        if problem is not None:
            raise ConfigError(f"{opt.flag} / {opt.env}: {problem}")


def source_of(field: str, options: tuple[Option, ...]) -> str:
    """How a user sets ``field``: "--flag / ENV_VAR", for error messages."""
    for opt in options:
        if opt.field == field:
            return f"{opt.flag} / {opt.env}"
    return field


def bool_flags(argv: list[str], options: tuple[Option, ...]) -> list[str]:
    """``argv`` with the spelling earlier versions required, ``--token-spans true`` or
    ``--instrument=false``, turned into ``--token-spans`` / ``--no-instrument``: scripts that
    pass a value (``llmobs bench``'s targets, running any version) keep working. A value that
    is not a boolean is left for argparse to refuse."""
    flags = {o.flag for o in options if o.parse is parse_bool}
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in flags and not eq and i + 1 < len(argv) and _is_bool(argv[i + 1]):
            name, eq, value = arg, "=", argv[i + 1]
            i += 1
        if name in flags and eq and _is_bool(value):
            arg = name if parse_bool(value) else "--no-" + name.removeprefix("--")
        out.append(arg)
        i += 1
    return out


def _is_bool(text: str) -> bool:
    try:
        parse_bool(text)
    except ValueError:
        return False
    return True


def shown_default(opt: Option) -> str | None:
    """An option's default as a user would type it back (``28d``, ``16MiB``, ``true``, ``10``);
    None when it has none to show (unset: its help says what happens then)."""
    value = opt.default
    if value is None or value in ("", ()):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if opt.parse is parse_duration:
        return format_duration(value)
    if opt.parse is parse_size:
        return format_size(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def add_arguments(parser: argparse.ArgumentParser, options: tuple[Option, ...]) -> None:
    """Add one flag per option (a boolean: ``--x`` and ``--no-x``); defaults stay None so
    the environment can fill them."""
    for opt in options:
        default = shown_default(opt)
        help_ = f"{opt.help} [env {opt.env}" + ("]" if default is None else f"; default {default}]")
        if opt.parse is parse_bool:  # --x, --no-x (and see bool_flags)
            parser.add_argument(
                opt.flag, dest=opt.field, default=None,
                action=argparse.BooleanOptionalAction, help=help_,
            )  # fmt: skip
            continue
        parser.add_argument(
            opt.flag, dest=opt.field, default=None, metavar=opt.metavar or None, help=help_
        )


def flags_of(args: argparse.Namespace, options: tuple[Option, ...]) -> dict[str, Any]:
    """The values of ``options`` found on parsed arguments."""
    return {o.field: getattr(args, o.field, None) for o in options}


def read_yaml(path: str | Path, flag: str) -> Any:
    """A configuration file's YAML; ``ConfigError`` naming ``flag`` and the file when it
    cannot be read or parsed (its shape is the caller's to check)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot be read ({exc.strerror or exc})") from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError(f"{flag} {path}: {where}{exc.problem}: not valid YAML") from None
    except yaml.YAMLError:
        raise ConfigError(f"{flag} {path}: not valid YAML") from None
