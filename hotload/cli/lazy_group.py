"""A command group that imports each subcommand's module only when that command runs.

``hotload --help`` and ``hotload local status`` should not pay for importing the
snapshot codec, the engines or kopf. A :class:`LazyGroup` knows its subcommands from a
static table of :class:`LazyCommand` entries (name, ``module:attribute`` of a
``typer.Typer``, and the one-line help its parent lists); it imports the module when the
command is resolved, and lists help from the table without importing anything.
``tests/unit/cli`` checks every entry against the command it loads (same help, same
hidden flag), so the table cannot drift from the commands.

typer vendors its own click, so click's types are spelled ``Any`` here rather than
imported from typer's private copy.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import typer
from typer.core import TyperCommand, TyperGroup

#: Options typer adds to every Typer it converts; ``hotload`` offers no shell completion.
_COMPLETION_PARAMS = frozenset({"install_completion", "show_completion"})


@dataclass(frozen=True)
class LazyCommand:
    """One subcommand: where its ``typer.Typer`` lives, and how its parent lists it."""

    name: str
    target: str
    """``module:attribute`` of a ``typer.Typer`` (one command, or a group of them)."""
    help: str
    """The first paragraph of the command's help: what its parent's ``--help`` lists."""
    hidden: bool = False

    def load(self) -> Any:
        """Import the module and build the (click) command of its Typer."""
        module_name, _, attribute = self.target.partition(":")
        typer_app = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(typer_app, typer.Typer):
            raise TypeError(f"{self.target} is not a typer.Typer")
        command = typer.main.get_command(typer_app)
        command.name = self.name
        command.params = [p for p in command.params if p.name not in _COMPLETION_PARAMS]
        return command

    def listing(self) -> TyperCommand:
        """A stand-in that carries only what a help listing shows (nothing imported)."""
        return TyperCommand(self.name, help=self.help, hidden=self.hidden)


class LazyGroup(TyperGroup):
    """A Typer group whose :attr:`lazy_commands` load on first use.

    Build one with :func:`lazy_group` and pass it as ``typer.Typer(cls=...)``. Commands
    registered on the Typer itself (``@app.command``) come first, then the table's, in
    its order. Until a lazy command is resolved, ``commands`` holds its stand-in, so
    listings and typo suggestions see every name.
    """

    lazy_commands: ClassVar[Sequence[LazyCommand]] = ()

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._lazy = {entry.name: entry for entry in self.lazy_commands}
        self._loaded: set[str] = set()
        self._listing = False
        for entry in self.lazy_commands:
            self.commands[entry.name] = entry.listing()

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        entry = self._lazy.get(cmd_name)
        if entry is not None and not self._listing and cmd_name not in self._loaded:
            self.commands[cmd_name] = entry.load()
            self._loaded.add(cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """Help of the group itself: subcommands are listed from the table, not imported."""
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


def lazy_group(commands: Sequence[LazyCommand]) -> type[LazyGroup]:
    """A :class:`LazyGroup` class for ``typer.Typer(cls=...)`` with these subcommands."""
    names = [entry.name for entry in commands]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate subcommand names: {names}")
    return type("LazyGroupOf", (LazyGroup,), {"lazy_commands": tuple(commands)})
