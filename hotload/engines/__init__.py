"""Adapters that swap weights into a running engine: reference, sglang, vllm, noop."""
