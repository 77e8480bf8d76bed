"""The benchmarks: each a package run as ``python -m bench.<name>.run`` (see README.md)."""
