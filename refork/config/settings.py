"""How a setting is declared once and turned into a flag, an environment variable and a docs row.

A Config field is declared with setting(): its default, its flags, help and the rest ride along in
the field's metadata, so the dataclass stays the one typed table and everything else (argparse,
loading, validation, --print-config, the options table in docs/configuration.md) is read from it.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, Generic, Literal, TypeVar, cast

from refork.config.coercers import Choice, Coercer

T = TypeVar("T")

Action = Literal["store", "append", "store_true", "boolean_optional", "optional"]
"""How the flag takes its value: once, repeated, present = true, or --x/--no-x."""

_KEY = "refork.setting"


@dataclasses.dataclass(frozen=True)
class Setting(Generic[T]):
    """One row of the settings table (see setting() for the meaning of each column)."""

    default: T
    flags: tuple[str, ...]
    coerce: Coercer[T]
    help: str
    group: str | None
    metavar: str | None
    action: Action
    restart_only: bool
    doc: str
    shown_default: str | None
    name: str = ""  # the field's name, filled in by settings_of()

    @property
    def env(self) -> str:
        """The environment variable that sets it."""
        return "REFORK_" + self.name.upper()

    @property
    def positional(self) -> bool:
        return not self.flags[0].startswith("-")

    @property
    def where(self) -> str:
        """How error messages name a value that came from the command line."""
        return self.flags[-1]


def setting(
    default: T,
    *flags: str,
    coerce: Coercer[T],
    help: str,
    group: str | None = None,
    metavar: str | None = None,
    action: Action = "store",
    restart_only: bool = False,
    doc: str = "",
    shown_default: str | None = None,
) -> T:
    """A dataclass field that is a setting.

    flags: the command-line flags (gunicorn's names where gunicorn has the option); a single name
    without dashes makes a positional argument named so in --help. coerce validates and converts a
    raw value from any source. help: the --help line; doc: a longer meaning for the docs table
    (defaults to help). group: the --help section. restart_only: HUP keeps the running value.
    shown_default: the default as the docs state it, when the value alone would not say it.
    The default metavar of a Literal choice is its values joined with "|".
    """
    if metavar is None and isinstance(coerce, Choice):
        metavar = "|".join(coerce.options)
    row = Setting(
        default, flags, coerce, help, group, metavar, action, restart_only, doc or help, shown_default
    )
    metadata = {_KEY: row}
    if isinstance(default, list):
        items = list(default)
        return cast(T, dataclasses.field(default_factory=lambda: list(items), metadata=metadata))
    if isinstance(default, dict):
        mapping = dict(default)
        return cast(T, dataclasses.field(default_factory=lambda: dict(mapping), metadata=metadata))
    return dataclasses.field(default=default, metadata=metadata)


def settings_of(cls: type) -> tuple[Setting[Any], ...]:
    """The settings a dataclass declares, in field order, each knowing its name."""
    return tuple(
        dataclasses.replace(f.metadata[_KEY], name=f.name)
        for f in dataclasses.fields(cls)
        if _KEY in f.metadata
    )


# --------------------------------------------------------------------------------------------
# argparse
# --------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser, settings: Iterable[Setting[Any]]) -> None:
    """One argument per setting, dest = its name; values stay raw strings for the coercers.

    The parser should have argument_default=argparse.SUPPRESS so an absent flag is absent.
    """
    groups: dict[str | None, argparse._ActionsContainer] = {None: parser}
    for s in settings:
        if s.group not in groups:
            groups[s.group] = parser.add_argument_group(s.group)
        add = groups[s.group].add_argument
        shown = _default(s).replace("`", "")
        text = s.help
        if shown and s.action != "store_true" and "default" not in text:
            text = f"{text} (default: {shown})"
        text = text.replace("%", "%%")
        if s.positional:
            add(s.name, nargs="?", metavar=s.flags[0], help=text)
        elif s.action == "store_true":  # not argparse's store_true: its False default would not be absent
            add(*s.flags, dest=s.name, action="store_const", const=True, help=text)
        elif s.action == "boolean_optional":
            add(*s.flags, dest=s.name, action=argparse.BooleanOptionalAction, help=text)
        elif s.action == "optional":  # a value, or the flag alone (True: the coercer says what it means)
            add(*s.flags, dest=s.name, nargs="?", const=True, metavar=s.metavar, help=text)
        else:
            add(*s.flags, dest=s.name, action=s.action, metavar=s.metavar, help=text)


def given(namespace: argparse.Namespace, settings: Sequence[Setting[Any]]) -> list[tuple[str, Any, str]]:
    """The settings present in a parsed namespace: [(name, raw value, flag)], in the order seen."""
    by_name = {s.name: s for s in settings}
    return [(name, value, by_name[name].where) for name, value in vars(namespace).items() if name in by_name]


# --------------------------------------------------------------------------------------------
# The options table in docs/configuration.md
# --------------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _option(s: Setting[Any]) -> str:
    if s.positional:
        return f"`{s.flags[0]}`"
    if s.action == "boolean_optional":
        long = s.flags[-1][2:]
        return f"`--{long}/--no-{long}`"
    names = "/".join(s.flags)
    if s.action == "optional":
        return f"`{names} [{s.metavar}]`"
    return f"`{names} {s.metavar}`" if s.metavar and s.action in ("store", "append") else f"`{names}`"


def _default(s: Setting[Any]) -> str:
    if s.shown_default is not None:
        return s.shown_default
    value = s.default
    if value is None or value == "" or value == [] or value == {}:
        return ""
    if isinstance(value, bool):
        text = "on" if value else "off"
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, list):
        text = ",".join(map(str, value))
    else:
        text = str(value)
    return f"`{text}`"


_HEADER = "| option | environment | default | meaning |"


def options_markdown(settings: Sequence[Setting[Any]]) -> str:
    """The options tables, one per --help group, generated from the settings themselves."""
    out: list[str] = []
    seen: list[str | None] = []
    for s in settings:
        if s.group not in seen:
            seen.append(s.group)
    for group in seen:
        out += ["", f"**{group or 'command'}**", "", _HEADER, "|---|---|---|---|"]
        for s in settings:
            if s.group != group:
                continue
            meaning = s.doc
            if s.action == "append":
                meaning = f"repeatable; {meaning}"
            if s.restart_only:
                meaning += " *(restart only)*"
            out.append(f"| {_cell(_option(s))} | `{s.env}` | {_cell(_default(s))} | {_cell(meaning)} |")
    return "\n".join(out[1:]) + "\n"


__all__ = ["Action", "Setting", "add_arguments", "given", "options_markdown", "setting", "settings_of"]
