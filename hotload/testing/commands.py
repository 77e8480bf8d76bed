"""``hotload engine fake-sglang|fake-vllm``: the fake engines as the engine container's command.

The product never imports this package (an import-linter contract says so); the
``hotload engine`` group names these two Typers by ``module:attribute`` in its lazy table
(:data:`hotload.cli.engine.FAKE_ENGINE_COMMANDS`), so the pod runtime can still run a fake
engine as a pod. Only this shell reads the environment.
"""

from __future__ import annotations

from pathlib import Path

import typer

from hotload.api.rollout_deployment import ENV_ENGINE_ADMIN_API_KEY, ENV_ENGINE_API_KEY

fake_sglang_app = typer.Typer(add_completion=False)
fake_vllm_app = typer.Typer(add_completion=False)


@fake_sglang_app.command()
def fake_sglang(
    port: int = typer.Option(30000, "--port", min=1, max=65535, help="Port to listen on."),
    host: str = typer.Option(
        "",
        "--host",
        envvar=["HOTLOAD_ENGINE_HOST", "POD_IP"],
        help="Address to bind (default: $HOTLOAD_ENGINE_HOST, else $POD_IP).",
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
    max_lora_rank: int | None = typer.Option(None, "--max-lora-rank", min=1),
    lora_target_modules: list[str] = typer.Option(
        [], "--lora-target-modules", help="Repeat per module (0.5.23 also takes a list)."
    ),
    token_interval: float = typer.Option(
        0.02, "--token-interval", min=0.0, help="Seconds per generated token."
    ),
) -> None:
    """Serve a fake SGLang 0.5.23 (its routes and answers; tensors held, no model run).

    As 0.5.23, ``--enable-lora`` needs ``--max-lora-rank`` and ``--lora-target-modules``."""
    import os

    import uvicorn

    from hotload.api.pod import ENV_ROOT
    from hotload.mounts import root_from
    from hotload.testing.sglang_app import SGLangOptions, create_app

    options = SGLangOptions(
        model_path=model_path,
        served_name=served_model_name or None,
        weight_version=weight_version,
        weights=weights,
        api_key=api_key or None,
        admin_api_key=admin_api_key or None,
        enable_lora=enable_lora,
        max_lora_rank=max_lora_rank,
        lora_target_modules=tuple(lora_target_modules),
        health_generation=os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "1")
        not in ("0", "false", "False"),
        health_timeout=float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20")),
        token_interval=token_interval,
        root=root_from(os.environ.get(ENV_ROOT)),
    )
    uvicorn.run(create_app(options), host=host or "0.0.0.0", port=port, log_level="warning")


@fake_vllm_app.command()
def fake_vllm(
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
    host: str = typer.Option(
        "",
        "--host",
        envvar=["HOTLOAD_ENGINE_HOST", "POD_IP"],
        help="Address to bind (default: $HOTLOAD_ENGINE_HOST, else $POD_IP).",
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
    from hotload.mounts import root_from
    from hotload.testing.vllm_app import VLLMOptions, create_app

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
