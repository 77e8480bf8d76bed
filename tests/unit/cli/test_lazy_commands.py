"""Subcommands load only when they run, and are listed exactly as they describe themselves.

Would catch: a table entry whose help differs from its command's own (``hotload --help``
would lie), a hidden command listed, a target that is not a Typer, and ``hotload --help``
importing a subcommand's module (the start-up cost the lazy table exists to avoid).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

import pytest
import typer

from hotload.cli import SUBCOMMANDS, app
from hotload.cli.engine import FAKE_ENGINE_COMMANDS, engine_app
from hotload.cli.lazy_group import LazyCommand, lazy_group
from hotload.cli.local import LOCAL_SUBCOMMANDS, local_app


def _help(typer_app: typer.Typer, capsys: pytest.CaptureFixture[str], *, loaded: bool) -> str:
    """``--help`` of the group, listing the table's stand-ins or the loaded commands."""
    group = typer.main.get_command(typer_app)
    if loaded:
        for name in group.list_commands(None):  # type: ignore[attr-defined]
            group.get_command(None, name)  # type: ignore[attr-defined]
    group.main(["--help"], prog_name="hotload", standalone_mode=False)
    return capsys.readouterr().out


@pytest.mark.parametrize(
    ("typer_app", "table"),
    [(app, SUBCOMMANDS), (local_app, LOCAL_SUBCOMMANDS), (engine_app, FAKE_ENGINE_COMMANDS)],
    ids=["hotload", "local", "engine"],
)
def test_the_listing_is_what_the_loaded_commands_say(
    typer_app: typer.Typer,
    table: Sequence[LazyCommand],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    listed = _help(typer_app, capsys, loaded=False)
    assert _help(typer_app, capsys, loaded=True) == listed
    for entry in table:
        command = entry.load()
        assert command.hidden == entry.hidden, entry.name
        assert (entry.name in listed) != entry.hidden, entry.name


def test_hotload_help_imports_no_subcommand_module() -> None:
    probe = (
        "import sys; sys.argv = ['hotload', '--help']\n"
        "from hotload.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('hotload')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    loaded = result.stdout.strip().splitlines()[-1]
    assert loaded == "['hotload', 'hotload.cli', 'hotload.cli.lazy_group', 'hotload.errors']"


def test_a_target_that_is_not_a_typer_is_refused() -> None:
    with pytest.raises(TypeError, match=r"not a typer\.Typer"):
        LazyCommand("x", "hotload.cli:SUBCOMMANDS", "x").load()


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        lazy_group([LazyCommand("a", "m:a", "a"), LazyCommand("a", "m:b", "b")])
