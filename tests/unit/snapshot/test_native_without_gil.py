"""The native kernels allocate only what is safe without the GIL while they run without it.

The context encoder grew its output with ``PyMem_Realloc`` after releasing the GIL. On
CPython 3.11 that races pymalloc only when two threads encode at once; on 3.12, whose
allocator state belongs to the interpreter of the calling thread, it crashed the first
encode (seen on the lent GPU machine's Python 3.12: a segmentation fault in every
context-coded encode). ``PYTHONMALLOC=debug`` makes any such call a fatal error on every
version, so each of the codec's native entry points (the encoder's scan, model fit, keyed
and not, and both stream loops, both decode loops, the applied changes) runs once under it
in a child process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hotload.engines.reference.spare import NATIVE as SPARE_NATIVE
from hotload.snapshot.codec.context_kernels import NATIVE as CODEC_NATIVE

REPO = Path(__file__).resolve().parents[3]

EXERCISE = """
import numpy as np
from hotload.snapshot.codec import context
from hotload.snapshot.codec.context_kernels import decode_chunk
from hotload.snapshot.codec.tensor_codec import CodecOptions, decode_tensor, encode_tensor
from hotload.snapshot.codec.transforms import apply_changes
from hotload.snapshot.manifest import CodecId

rng = np.random.default_rng(0)
old = rng.integers(0, 2**16, 300_000, dtype=np.uint16)
new = old.copy()
new[rng.choice(len(old), 20_000, replace=False)] += 1
# encode: a stream far past the writer's first 256 bytes, so it grows without the GIL
encoded = encode_tensor(new, old, CodecOptions(codecs=(CodecId.CONTEXT,)))
assert encoded.codec is CodecId.CONTEXT and len(encoded.payload) > 4096
assert encode_tensor(new, old, CodecOptions(codecs=(CodecId.CONTEXT,)), simd=False) == encoded
# a keyed model (bf16's exponent: the scan's keys, fit_prepare and fit_finish's window)
keyed = encode_tensor(new, old, CodecOptions(codecs=(CodecId.CONTEXT,)), dtype="BF16")
out = old.copy()
decode_tensor(keyed.codec, keyed.payload, out, tensor="t", changed=keyed.changed)
assert keyed.codec is CodecId.CONTEXT and np.array_equal(out, new)
for chunk in context.parse(memoryview(encoded.payload), len(old), 2, tensor="t"):
    for simd in (True, False):
        decode_chunk(old[chunk.start:], chunk.model, chunk.stream, chunk.changes,
                     what="t", simd=simd)
out = old.copy()
decode_tensor(encoded.codec, encoded.payload, out, tensor="t", changed=encoded.changed)
assert np.array_equal(out, new)
undo = apply_changes(old.copy(), np.arange(0, 1000, 3, dtype=np.uint32),
                     np.ones(334, dtype=np.uint16))
assert len(undo) == 334
print("ok")
"""


def test_native_kernels_hold_to_the_gil_rules_under_the_debug_allocator() -> None:
    # the suite's install builds both native modules (hack/bootstrap)
    assert CODEC_NATIVE and SPARE_NATIVE
    env = {**os.environ, "PYTHONMALLOC": "debug", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", EXERCISE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
