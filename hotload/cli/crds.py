"""``hotload crds``: render both CRDs from the API models.

``hotload crds --out crds --chart charts/hotload`` regenerates every checked-in copy at once:
the repository's ``crds/`` and the chart's ``crds/`` (a test keeps all of them equal to the
models). The chart's own kopf peering CRD is not ours to render and is left alone.
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer()


def render_documents() -> dict[str, str]:
    """File name → YAML text, exactly as checked in under ``crds/``."""
    import yaml

    from hotload.api.crd import render_all

    header = "# Rendered from hotload.api by `hotload crds`: do not edit by hand.\n"
    return {
        name: header + yaml.safe_dump(crd, sort_keys=False, width=100)
        for name, crd in render_all().items()
    }


@app.command("crds")
def crds(
    out: Path | None = typer.Option(
        None, "--out", "-d", help="Write one file per CRD into this directory (else stdout)."
    ),
    chart: Path | None = typer.Option(
        None, "--chart", help="Also write them into this chart's crds/ (e.g. charts/hotload)."
    ),
) -> None:
    """Print (or write) the CustomResourceDefinitions of RolloutDeployment and PolicySnapshot."""
    documents = render_documents()
    targets = [out] if out is not None else []
    if chart is not None:
        if not (chart / "Chart.yaml").is_file():
            raise typer.BadParameter(
                f"{chart} is not a helm chart (no Chart.yaml)", param_hint="--chart"
            )
        targets.append(chart / "crds")
    if not targets:
        typer.echo("---\n".join(documents.values()), nl=False)
        return
    for directory in targets:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in documents.items():
            (directory / name).write_text(text)
            typer.echo(f"wrote {directory / name}")
