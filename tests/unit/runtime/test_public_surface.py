"""The runtime package's public names are a deliberate choice (a rename fails here)."""

import hotload.local.runtime as runtime


def test_the_public_surface_is_pinned() -> None:
    assert sorted(runtime.__all__) == [
        "PROCESS_NAME",
        "PodRuntime",
        "ProcessLedger",
        "RestartBackoff",
        "RuntimeSettings",
        "read_ports",
        "read_ready",
        "ready_file",
        "run_runtime",
        "runtime_process",
        "settings_for",
    ]
    assert all(hasattr(runtime, name) for name in runtime.__all__)
