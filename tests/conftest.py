"""Test-suite-wide pytest configuration: shared fixtures are plugins under tests/fixtures."""

pytest_plugins = [
    "tests.fixtures.cluster",
    "tests.fixtures.chart",
    "tests.fixtures.minio",
    "tests.fixtures.vllm",
]
