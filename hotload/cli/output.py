"""``-o table|json|yaml``: how every command prints data, in one place.

``json`` and ``yaml`` print the command's plain data (lists and dicts of JSON types) for
scripts, with one key style everywhere: camelCase field names, as kubectl prints API
objects (so a script reading ``hotload status -o json`` and ``kubectl get -o json`` uses
one convention; keys that are data, such as tensor or process names, are left as they
are). ``table`` is for people and each command lays out its own columns with
:func:`print_table`. rich and yaml are imported only when
used, so importing this module stays cheap.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import fields
from enum import StrEnum
from typing import Any

import typer


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


def camel(name: str) -> str:
    """``target_step`` → ``targetStep``: a Python field name in the output's key style."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def record(row: Any) -> dict[str, Any]:
    """A dataclass row as output data: its field names camelCased, values as they are."""
    return {camel(f.name): getattr(row, f.name) for f in fields(row)}


def emit(data: Any, output: OutputFormat) -> bool:
    """Print ``data`` as JSON or YAML; False when the caller should print its table."""
    if output is OutputFormat.JSON:
        typer.echo(json.dumps(data, indent=2))
        return True
    if output is OutputFormat.YAML:
        import yaml

        typer.echo(yaml.safe_dump(data, sort_keys=False), nl=False)
        return True
    return False


def print_table(columns: Sequence[str], rows: Iterable[Sequence[str]], *, width: int) -> None:
    """A borderless table (kubectl's look: upper-case ``columns``), ``width`` wide."""
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    Console(width=width).print(table)
