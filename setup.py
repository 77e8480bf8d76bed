"""Builds the one native module of hotload (the context codec's kernels).

Everything else is in pyproject.toml; setuptools reads the extension from here because
pyproject.toml cannot declare one portably. ``pip install -e .`` compiles it in place;
in a work tree without an install, ``python setup.py build_ext --inplace`` does.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "hotload.snapshot.codec._context",
            sources=["hotload/snapshot/codec/_context.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ]
)
