"""Structured logging: one JSON object a line off a terminal, readable lines on one.

Every record may carry context (object, snapshot identity, replica) through ``extra=``;
values whose key looks like a credential are replaced before anything is written, so a
secret never reaches a log even when a caller passes one by mistake.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Final, TextIO

_SECRET_MARKERS: Final = (
    "secret",
    "password",
    "token",
    "credential",
    "access_key",
    "authorization",
)
_STANDARD_ATTRS: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)
REDACTED: Final = "<redacted>"


def redact(key: str, value: Any) -> Any:
    """``value`` unless ``key`` names a credential."""
    lowered = key.lower()
    if any(marker in lowered for marker in _SECRET_MARKERS):
        return REDACTED
    return value


def _context(record: logging.LogRecord) -> dict[str, Any]:
    return {
        key: redact(key, value)
        for key, value in vars(record).items()
        if key not in _STANDARD_ATTRS and not key.startswith("_")
    }


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_context(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        context = " ".join(f"{k}={v}" for k, v in _context(record).items())
        line = f"{record.levelname.lower():7} {record.name}: {record.getMessage()}"
        if context:
            line = f"{line}  {context}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


def configure(
    level: str = "INFO", stream: TextIO | None = None, *, json_lines: bool | None = None
) -> None:
    """Set up the root logger once per process (the shells call this, libraries never do)."""
    target = stream or sys.stderr
    if json_lines is None:
        json_lines = not target.isatty()
    handler = logging.StreamHandler(target)
    handler.setFormatter(JsonFormatter() if json_lines else ConsoleFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "botocore", "urllib3", "kubernetes_asyncio", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
