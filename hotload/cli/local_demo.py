"""``hotload local demo``: the main job on the embedded default (see hotload.local.demo)."""

from __future__ import annotations

from pathlib import Path

import typer

from hotload.cli.local import STATE_HELP

app = typer.Typer()


@app.command("demo")
def demo_command(
    regions: int = typer.Option(2, "--regions", "-n", min=1, help="How many local regions."),
    replicas: int = typer.Option(2, "--replicas", min=1, help="Replicas per region."),
    deltas: int = typer.Option(4, "--deltas", min=0, help="Deltas to publish after the Full."),
    lr: float = typer.Option(1e-5, "--lr", help="The trainer's learning rate (RL-like: small)."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait for each rollout."),
    state: Path | None = typer.Option(None, "--state-dir", help=STATE_HELP),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the timings here."),
    break_chain: bool = typer.Option(
        True,
        "--break-chain/--no-break-chain",
        help="Corrupt one delta in the bucket and show the fallback to the next Full.",
    ),
) -> None:
    """Install the chart, publish snapshots, break one delta, watch every replica recover."""
    from hotload.local.demo import DemoSettings, run_demo, timings_json

    settings = DemoSettings(
        regions=regions,
        replicas=replicas,
        deltas=deltas,
        lr=lr,
        ready_timeout_s=timeout,
        state_dir=state,
        break_chain=break_chain,
    )
    result = run_demo(settings, say=typer.echo)
    if json_out is not None:
        json_out.write_text(timings_json(result.timings) + "\n")
