"""The reference engine: a small transformers causal LM served over HTTP (``hotload engine
reference``), the engine our tests and the demo run for real.

``model`` builds the architecture and its snapshots; ``weights`` reads and checks them;
``runtime`` serves generations and swaps weights; ``app`` is its FastAPI front with
``schemas`` for the bodies; ``cache`` keeps prompt KV caches; ``tokenizer`` maps bytes to
tokens. This package imports none of them, so ``schemas`` and ``tokenizer`` stay usable
without torch; import the module you need. The sidecar's side of the engine is
:class:`hotload.engines.ReferenceEngine` (``reference_adapter``), which needs no torch.
"""
