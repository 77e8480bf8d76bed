"""The progress of ``hotload publish``: a live table per region on a terminal (rich),
plain lines otherwise (one per region event, on stderr)."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from hotload.api import SnapshotKind
from hotload.api.kinds import Identity
from hotload.publish import Phase, PublishResult, RegionResult


@dataclass
class _Row:
    phase: str = "waiting"
    detail: str = ""


def _bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{count} B"


def _detail(phase: Phase, done: int | None, total: int | None) -> str:
    if done is None or total is None:
        return ""
    if phase in (Phase.UPLOADING, Phase.CATCHING_UP):
        return f"{_bytes(done)} / {_bytes(total)}"
    return f"{done}/{total} replicas Ready"


def _outcome(result: RegionResult) -> str:
    parts = [result.outcome.value]
    if result.ready_seconds is not None:
        parts.append(f"in {result.ready_seconds:.1f} s")
    if result.caught_up:
        parts.append(f"(caught up {len(result.caught_up)})")
    if result.error:
        parts.append(f"- {result.error}")
    return " ".join(parts)


class LinesProgress:
    """One line per event, for logs and pipes."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._last: dict[str, str] = {}

    def _say(self, line: str) -> None:
        with self._lock:
            print(line, file=self._stream, flush=True)

    def snapshot_encoded(
        self, identity: Identity, kind: SnapshotKind, step: int, stored_bytes: int, full_bytes: int
    ) -> None:
        ratio = f", {full_bytes / stored_bytes:.0f}x smaller" if stored_bytes else ""
        self._say(f"{identity}: {kind.value} of step {step}, {_bytes(stored_bytes)}{ratio}")

    def region_progress(
        self, context: str, phase: Phase, done: int | None = None, total: int | None = None
    ) -> None:
        if self._last.get(context) == phase.value:
            return  # one line per phase change, not per byte
        self._last[context] = phase.value
        self._say(f"  {context}: {phase.value}")

    def region_done(self, context: str, result: RegionResult) -> None:
        self._last.pop(context, None)
        self._say(f"  {context}: {_outcome(result)}")

    def publish_done(self, result: PublishResult) -> None:
        return None


class LiveProgress:
    """A live table: one row per region, its phase and its bytes or replicas."""

    def __init__(self, contexts: list[str], console: Console | None = None) -> None:
        self._rows = {context: _Row() for context in contexts}
        self._title = "encoding"
        self._lock = threading.Lock()
        self._live = Live(
            self._table(), console=console or Console(stderr=True), refresh_per_second=8
        )

    def __enter__(self) -> LiveProgress:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(None, None, None)

    def _table(self) -> Table:
        table = Table(title=self._title, box=None, pad_edge=False, title_justify="left")
        table.add_column("REGION")
        table.add_column("PHASE")
        table.add_column("PROGRESS")
        for context, row in self._rows.items():
            table.add_row(context, row.phase, row.detail)
        return table

    def _refresh(self) -> None:
        self._live.update(self._table())

    def snapshot_encoded(
        self, identity: Identity, kind: SnapshotKind, step: int, stored_bytes: int, full_bytes: int
    ) -> None:
        with self._lock:
            self._title = f"{identity} ({kind.value}, step {step}, {_bytes(stored_bytes)})"
            for row in self._rows.values():
                row.phase, row.detail = "waiting", ""
            self._refresh()

    def region_progress(
        self, context: str, phase: Phase, done: int | None = None, total: int | None = None
    ) -> None:
        with self._lock:
            row = self._rows.setdefault(context, _Row())
            row.phase, row.detail = phase.value, _detail(phase, done, total)
            self._refresh()

    def region_done(self, context: str, result: RegionResult) -> None:
        with self._lock:
            row = self._rows.setdefault(context, _Row())
            row.phase, row.detail = result.outcome.value, _outcome(result).partition(" ")[2]
            self._refresh()

    def publish_done(self, result: PublishResult) -> None:
        return None
