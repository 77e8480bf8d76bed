"""Test doubles: engines that behave like the released SGLang and vLLM servers, without a GPU.

Nothing in the product imports this package (an import-linter contract in pyproject.toml
forbids it): it ships so that ``hotload engine fake-sglang|fake-vllm`` can run the fakes as
pods of the local runtime, and so that tests can use them in process.

``contract`` loads the route table and models ``hack/engine-fixtures`` extracted from the
released wheels; the fake servers (:mod:`hotload.testing.commands`) answer those routes the
way the released handlers do.
"""
