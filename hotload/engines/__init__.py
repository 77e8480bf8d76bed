"""Engine adapters behind one :class:`Engine` Protocol: reference, sglang, vllm, noop.

Use :func:`make_engine` with the RolloutDeployment's ``spec.engine.kind``. The reference
engine's server (``hotload engine reference``) lives in the ``hotload.engines.reference``
subpackage and imports torch; importing this package does not.
"""

from hotload.engines.factory import engine_url, make_engine
from hotload.engines.identity_fields import reference_identities, weight_versions
from hotload.engines.noop_engine import NoopEngine
from hotload.engines.protocol import Engine, PauseMode
from hotload.engines.reference_adapter import ReferenceEngine
from hotload.engines.sglang_adapter import SGLangEngine
from hotload.engines.vllm_adapter import VLLMEngine

__all__ = [
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
