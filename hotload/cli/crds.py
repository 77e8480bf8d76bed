"""``hotload crds``: render both CRDs from the API models."""

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
) -> None:
    """Print (or write) the CustomResourceDefinitions of RolloutDeployment and PolicySnapshot."""
    documents = render_documents()
    if out is None:
        typer.echo("---\n".join(documents.values()), nl=False)
        return
    out.mkdir(parents=True, exist_ok=True)
    for name, text in documents.items():
        (out / name).write_text(text)
        typer.echo(f"wrote {out / name}")
