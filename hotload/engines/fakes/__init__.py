"""Engines that behave like the released SGLang and vLLM servers, for tests without a GPU.

``contract`` loads the route table and models ``hack/engine-fixtures`` extracted from the
released wheels; the fake servers (``hotload engine fake-sglang|fake-vllm``) answer those
routes the way the released handlers do.
"""
