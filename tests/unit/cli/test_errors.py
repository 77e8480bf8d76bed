"""Every CLI error is one line naming its reason; invalid arguments exit 2 without a
traceback; typed failures exit 1; a bug says InternalError, its traceback only in debug."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotload.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 0), out, err


@pytest.mark.parametrize(
    "argv",
    [
        ("nosuch",),
        ("ledger", "-o", "xml"),
        ("local", "up", "--regions", "0"),
        ("snapshot", "verify"),
        ("engine", "reference", "--identity", "x"),
    ],
    ids=lambda argv: " ".join(argv),
)
def test_invalid_arguments_exit_2_with_the_usage_and_one_error_line(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error [")]
    assert len(errors) == 1 and errors[0].startswith("error [Usage]: "), err
    assert err.startswith("Usage: hotload")


def test_a_typed_failure_names_its_reason_and_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "snapshot", "verify", str(tmp_path))
    assert code == 1
    assert err.startswith("error [ManifestInvalid]: snapshot directory has no manifest")
    assert str(tmp_path) in err, "the error says where"


def test_a_file_the_system_refuses_is_no_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, _, err = run(capsys, "crds", "--out", str(blocker / "crds"))
    assert code == 1
    assert err.startswith("error [NotFound]: ") and str(blocker) in err
    assert "Traceback" not in err


def test_no_arguments_show_the_help_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys)
    assert code == 2
    assert "Usage: hotload" in out and "snapshot" in out
    assert "error" not in err


def test_a_bug_is_an_internal_error_line_with_its_traceback_only_in_debug(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import hotload.cli.crds as crds

    def broken(*_: object, **__: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(crds, "render_documents", broken)
    code, _, err = run(capsys, "crds")
    assert code == 1
    assert err.startswith("error [InternalError]: KeyError: ")
    assert "Traceback" not in err and "--log-level debug" in err
