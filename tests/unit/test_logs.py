from __future__ import annotations

import io
import json
import logging

from hotload import logs


def test_json_lines_carry_context_and_never_secrets() -> None:
    stream = io.StringIO()
    logs.configure("INFO", stream, json_lines=True)
    logging.getLogger("hotload.test").info(
        "fetched", extra={"snapshot": "step-3", "aws_secret_access_key": "hunter2", "token": "abc"}
    )
    entry = json.loads(stream.getvalue().splitlines()[-1])
    assert entry["message"] == "fetched" and entry["snapshot"] == "step-3"
    assert "hunter2" not in stream.getvalue() and "abc" not in stream.getvalue()
    assert entry["aws_secret_access_key"] == logs.REDACTED
