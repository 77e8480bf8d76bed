"""The public names of ``hotload.engines``: a rename is a deliberate act; importing the
package must not pull torch in (the sidecar and operator images may lack it)."""

from __future__ import annotations

import subprocess
import sys

import hotload.engines


def test_public_names_are_pinned() -> None:
    assert sorted(hotload.engines.__all__) == [
        "Engine",
        "NoopEngine",
        "PauseMode",
        "ReferenceEngine",
        "SGLangEngine",
        "VLLMEngine",
        "engine_url",
        "make_engine",
        "reference_identities",
        "weight_versions",
    ]


def test_importing_the_adapters_does_not_import_torch() -> None:
    probe = "import sys, hotload.engines; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
