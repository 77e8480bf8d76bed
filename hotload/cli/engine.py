"""``hotload engine reference|noop|fake-sglang|fake-vllm``: the engine container's command.

``reference`` serves a small transformers causal LM (see docs/engines.md) on
``$HOTLOAD_ENGINE_HOST:<port>`` (the pod's loopback in a rendered pod, so its admin routes
are reachable from inside the pod only), else ``$POD_IP`` (all interfaces when neither is
set). ``noop`` is the placeholder process of a ``noop`` engine container: it serves
nothing and waits for SIGTERM. ``fake-sglang`` and ``fake-vllm`` answer like the released
SGLang 0.5.23 and vLLM 0.33.0 servers (their routes, answers and quirks; tensors held, no
model run), so the sidecar, the adapters and the pod runtime can be tested with those
engine kinds where no GPU is (docs/engines.md, "Fake engines"). The fakes are test
doubles in :mod:`hotload.testing`, which no product module imports: this group names their
commands by ``module:attribute`` (:data:`FAKE_ENGINE_COMMANDS`) and loads them only when one
runs. Only this shell reads the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import typer

from hotload.api.pod import REFERENCE_ENGINE_PORT
from hotload.cli.lazy_group import LazyCommand, lazy_group

#: The fake engines' commands, loaded from the test doubles' package only when one runs.
FAKE_ENGINE_COMMANDS: Final = (
    LazyCommand(
        "fake-sglang",
        "hotload.testing.commands:fake_sglang_app",
        "Serve a fake SGLang 0.5.23 (its routes and answers; tensors held, no model run).",
    ),
    LazyCommand(
        "fake-vllm",
        "hotload.testing.commands:fake_vllm_app",
        "Serve a fake vLLM 0.33.0 (dev-mode routes with VLLM_SERVER_DEV_MODE=1; no model run).",
    ),
)

engine_app = typer.Typer(
    help="Run an inference engine (the engine container's command).",
    cls=lazy_group(FAKE_ENGINE_COMMANDS),
    no_args_is_help=True,
)


@engine_app.command("reference")
def reference(
    port: int = typer.Option(
        REFERENCE_ENGINE_PORT, "--port", min=1, max=65535, help="Port to listen on."
    ),
    host: str = typer.Option(
        "",
        "--host",
        envvar=["HOTLOAD_ENGINE_HOST", "POD_IP"],
        help="Address to bind (default: $HOTLOAD_ENGINE_HOST, else $POD_IP; all interfaces "
        "when neither is set).",
    ),
    model_config: str = typer.Option(
        "tiny",
        "--model-config",
        help="A size (tiny, small, 0.5b) or a config.json file or directory.",
    ),
    weights: Path | None = typer.Option(
        None,
        "--weights",
        help="Serve this full snapshot directory from the start (else the seeded init).",
    ),
    identity: str = typer.Option(
        "",
        "--identity",
        help="Identity of --weights (default: the directory's name; 'init' without --weights).",
    ),
    served_name: str = typer.Option("reference", "--served-name", help="Model name in responses."),
    dtype: str = typer.Option(
        "float32", "--dtype", help="Compute dtype: float32 (default) or bfloat16."
    ),
    storage_dtype: str = typer.Option(
        "bfloat16", "--storage-dtype", help="Dtype snapshots hold when --model-config is a size."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the initial weights."),
    threads: int = typer.Option(
        0, "--threads", min=0, help="Torch CPU threads (0: torch's default)."
    ),
    cache_capacity: int = typer.Option(
        64, "--cache-capacity", min=1, help="Prompt-cache entries kept."
    ),
    patch_nice: int = typer.Option(
        0,
        "--patch-nice",
        min=0,
        max=19,
        help="Lower the delta patch thread's CPU priority by this much (Linux), so that "
        "streaming forward passes win the cores during a patch.",
    ),
) -> None:
    """Serve the reference engine (OpenAI-compatible, hot-swappable weights)."""
    import asyncio
    import os

    import torch
    import uvicorn

    from hotload.api.pod import ENV_ROOT
    from hotload.engines.reference import model as rm
    from hotload.engines.reference.app import create_app
    from hotload.engines.reference.runtime import INITIAL_IDENTITY, ReferenceRuntime
    from hotload.mounts import root_from

    if threads:
        torch.set_num_threads(threads)
    config = rm.build_config(model_config, dtype=storage_dtype)
    runtime = ReferenceRuntime(
        config,
        compute_dtype=rm.dtype_named(dtype),
        seed=seed,
        cache_capacity=cache_capacity,
        patch_nice=patch_nice,
    )
    if weights is not None:
        runtime.load_initial(weights, identity or weights.name)
    elif identity and identity != INITIAL_IDENTITY:
        raise typer.BadParameter("--identity names --weights; without them the identity is 'init'")
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(
                runtime,
                served_name=served_name,
                root=root_from(os.environ.get(ENV_ROOT)),
            ),
            host=host or "0.0.0.0",
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
        )
    )
    asyncio.run(server.serve())


@engine_app.command("noop")
def noop() -> None:
    """Serve nothing until SIGTERM (the container of a ``noop`` engine)."""
    import asyncio
    import logging
    import signal

    async def wait_for_signal() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        logging.getLogger(__name__).info("noop engine: serving nothing until SIGTERM")
        await stop.wait()

    asyncio.run(wait_for_signal())
