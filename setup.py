"""Builds hotload's native modules: the context codec's kernels, the split xxh3-128's
stripe loop, and the reference engine's spare widening (each has a pure-Python fallback
with the same results).

Everything else is in pyproject.toml; setuptools reads the extension from here because
pyproject.toml cannot declare one portably. ``pip install -e .`` compiles it in place;
in a work tree without an install, ``python setup.py build_ext --inplace`` does.
"""

from setuptools import Extension, setup

# -ffp-contract=off: no fused multiply-add, so the context model's float arithmetic in C
# rounds as numpy's separate elementwise operations do (the same model on every CPU)
FLAGS = ["-O3", "-std=c11", "-ffp-contract=off", "-Wall", "-Wextra", "-Wno-unused-parameter"]

setup(
    ext_modules=[
        Extension(
            "hotload.snapshot.codec._context",
            sources=["hotload/snapshot/codec/_context.c"],
            extra_compile_args=FLAGS,
        ),
        Extension(
            "hotload.snapshot._stream_hash",
            sources=["hotload/snapshot/_stream_hash.c"],
            extra_compile_args=FLAGS,
        ),
        Extension(
            "hotload.engines.reference._spare",
            sources=["hotload/engines/reference/_spare.c"],
            extra_compile_args=FLAGS,
        ),
    ]
)
