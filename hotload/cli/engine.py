"""``hotload engine reference|noop|fake-sglang|fake-vllm``: the engine container's command.

``reference`` serves a small transformers causal LM (see docs/engines.md) on
``$POD_IP:<port>`` (all interfaces only when ``POD_IP`` is unset: nothing in a pod binds
127.0.0.1). ``noop`` is the placeholder process of a ``noop`` engine container: it serves
nothing and waits for SIGTERM. ``fake-sglang`` and ``fake-vllm`` answer like the released
SGLang 0.5.23 and vLLM 0.33.0 servers (their routes, answers and quirks; tensors held, no
model run), so the sidecar, the adapters and the pod runtime can be tested with those
engine kinds where no GPU is (docs/engines.md, "Fake engines"). Only this shell reads the
environment.
"""

from __future__ import annotations

from pathlib import Path

import typer

from hotload.api.pod import REFERENCE_ENGINE_PORT
from hotload.api.rollout_deployment import ENV_ENGINE_ADMIN_API_KEY, ENV_ENGINE_API_KEY

engine_app = typer.Typer(
    help="Run an inference engine (the engine container's command).", no_args_is_help=True
)


@engine_app.command("reference")
def reference(
    port: int = typer.Option(
        REFERENCE_ENGINE_PORT, "--port", min=1, max=65535, help="Port to listen on."
    ),
    host: str = typer.Option(
        "",
        "--host",
        envvar="POD_IP",
        help="Address to bind (default: $POD_IP; all interfaces when unset).",
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


@engine_app.command("fake-sglang")
def fake_sglang(
    port: int = typer.Option(30000, "--port", min=1, max=65535, help="Port to listen on."),
    host: str = typer.Option(
        "", "--host", envvar="POD_IP", help="Address to bind (default: $POD_IP)."
    ),
    model_path: str = typer.Option("/models/base", "--model-path", help="The launch model path."),
    served_model_name: str = typer.Option(
        "", "--served-model-name", help="Name in /v1/models (default: the model path)."
    ),
    weight_version: str = typer.Option(
        "default", "--weight-version", help="The launch weight version."
    ),
    weights: Path | None = typer.Option(
        None, "--weights", help="Serve the tensors of this directory from the start."
    ),
    api_key: str = typer.Option("", "--api-key", envvar=ENV_ENGINE_API_KEY),
    admin_api_key: str = typer.Option("", "--admin-api-key", envvar=ENV_ENGINE_ADMIN_API_KEY),
    enable_lora: bool = typer.Option(False, "--enable-lora", help="Accept LoRA adapters."),
    token_interval: float = typer.Option(
        0.02, "--token-interval", min=0.0, help="Seconds per generated token."
    ),
) -> None:
    """Serve a fake SGLang 0.5.23 (its routes and answers; tensors held, no model run)."""
    import os

    import uvicorn

    from hotload.api.pod import ENV_ROOT
    from hotload.engines.fakes.sglang_app import SGLangOptions, create_app
    from hotload.mounts import root_from

    options = SGLangOptions(
        model_path=model_path,
        served_name=served_model_name or None,
        weight_version=weight_version,
        weights=weights,
        api_key=api_key or None,
        admin_api_key=admin_api_key or None,
        enable_lora=enable_lora,
        health_generation=os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "1")
        not in ("0", "false", "False"),
        health_timeout=float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20")),
        token_interval=token_interval,
        root=root_from(os.environ.get(ENV_ROOT)),
    )
    uvicorn.run(create_app(options), host=host or "0.0.0.0", port=port, log_level="warning")


@engine_app.command("fake-vllm")
def fake_vllm(
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
    host: str = typer.Option(
        "", "--host", envvar="POD_IP", help="Address to bind (default: $POD_IP)."
    ),
    model: str = typer.Option("/models/base", "--model", help="The launch model."),
    served_model_name: str = typer.Option(
        "", "--served-model-name", help="Name requests must use (default: the model)."
    ),
    weights: Path | None = typer.Option(
        None, "--weights", help="Serve the tensors of this directory from the start."
    ),
    api_key: str = typer.Option("", "--api-key", envvar=ENV_ENGINE_API_KEY),
    token_interval: float = typer.Option(
        0.02, "--token-interval", min=0.0, help="Seconds per generated token."
    ),
) -> None:
    """Serve a fake vLLM 0.33.0 (dev-mode routes with VLLM_SERVER_DEV_MODE=1; no model run)."""
    import os

    import uvicorn

    from hotload.api.pod import ENV_ROOT
    from hotload.engines.fakes.vllm_app import VLLMOptions, create_app
    from hotload.mounts import root_from

    def flag(name: str) -> bool:
        return os.environ.get(name, "0").strip().lower() in ("1", "true")

    options = VLLMOptions(
        model=model,
        served_name=served_model_name or None,
        weights=weights,
        api_key=api_key or None,
        dev_mode=flag("VLLM_SERVER_DEV_MODE"),
        runtime_lora=flag("VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
        token_interval=token_interval,
        root=root_from(os.environ.get(ENV_ROOT)),
    )
    uvicorn.run(create_app(options), host=host or "0.0.0.0", port=port, log_level="warning")
