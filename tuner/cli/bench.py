"""`tuner bench ...`: the bundled bench: build it (`setup`, tuner.bench.setup_bench) and say
where its binaries and models are (`where`, tuner.bench.load_bench)."""

from __future__ import annotations

from typing import Annotated

import typer

from tuner.cli.options import Commands, err, out, reports_errors, settings

bench_app = Commands(
    help="The bundled bench: patched llama-server and small test models.", no_args_is_help=True
)

JobsOption = Annotated[
    int | None, typer.Option("--jobs", "-j", help="build jobs (default: all cores)")
]
VariantOption = Annotated[
    str | None,
    typer.Option(
        help="build variant: portable (AVX2, no AVX-512/AMX) or baseline (SSE4.2); "
        "default: the safest this CPU runs, falling back on an illegal instruction"
    ),
]


@bench_app.command("setup")
@reports_errors
def setup(jobs: JobsOption = None, variant: VariantOption = None) -> None:
    """Build the patched llama-server and the bench models, prove them on this machine, and
    write the bench manifest (cached; a second run only proves again on another CPU)."""
    from tuner.bench import setup_bench

    current = settings()
    bench = setup_bench(
        current.cache_dir,
        current.bench_manifest_path,
        progress=lambda msg: err.print(f"[cyan]bench:[/] {msg}", highlight=False),
        jobs=jobs,
        variant=variant,
    )
    for name, path in bench.as_refs().items():
        out.print(f"{name:20} {path}", highlight=False)
    err.print(f"bench manifest: {current.bench_manifest_path}", highlight=False)


@bench_app.command("where")
@reports_errors
def where() -> None:
    """Print where the bench's binaries and models are (the names a spec's bench:NAME takes)."""
    from tuner.bench import load_bench

    bench = load_bench(settings().bench_manifest_path)
    for name, path in bench.as_refs().items():
        out.print(f"{name:20} {path}", highlight=False)
