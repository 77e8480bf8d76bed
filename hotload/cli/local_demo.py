"""``hotload local demo``: the main job (see hotload.local.demo)."""

from __future__ import annotations

from pathlib import Path

import typer

from hotload.cli.local import STATE_HELP

app = typer.Typer()


@app.command("demo")
def demo_command(
    regions: int = typer.Option(3, "--regions", "-n", min=1, help="How many local regions."),
    replicas: int = typer.Option(2, "--replicas", min=1, help="Replicas per region."),
    steps: int = typer.Option(30, "--steps", min=1, help="Training steps to publish."),
    full_every: int = typer.Option(25, "--full-every", min=1, help="A Full every N steps."),
    corrupt_step: int = typer.Option(
        27, "--corrupt-step", min=0, help="The step whose delta is stored damaged."
    ),
    break_chain: bool = typer.Option(
        True,
        "--break-chain/--no-break-chain",
        help="Store one delta damaged and show the fallback to a Full.",
    ),
    lr: float = typer.Option(1e-6, "--lr", help="The trainer's learning rate (RL-like: small)."),
    size: str = typer.Option(
        "demo", "--size", help="demo (~6.4M parameters), tiny, small, or a config.json."
    ),
    wan_rate: int = typer.Option(20_000, "--wan-rate", min=0, help="WAN KB/s (0: unlimited)."),
    wan_latency: int = typer.Option(40, "--wan-latency", min=0, help="WAN one-way ms."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds to wait for each rollout."),
    state: Path | None = typer.Option(None, "--state-dir", help=STATE_HELP),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the timings here."),
) -> None:
    """Train and publish to three regions, break one delta, watch every replica follow."""
    from hotload.local.demo import DemoSettings, run_demo, timings_json

    settings = DemoSettings(
        regions=regions,
        replicas=replicas,
        steps=steps,
        full_every=full_every,
        corrupt_step=corrupt_step if break_chain else None,
        size=size,
        lr=lr,
        wan_rate_kb_s=wan_rate,
        wan_latency_ms=wan_latency,
        ready_timeout_s=timeout,
        state_dir=state,
    )
    result = run_demo(settings, say=typer.echo)
    if json_out is not None:
        json_out.write_text(timings_json(result.timings) + "\n")
