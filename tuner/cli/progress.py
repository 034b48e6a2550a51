"""The progress display of long runs (profile, tune, validate): a rich progress bar with
configuration, level, repeat and ETA, and one line per finished repeat; and measure_live, which
runs a model's live measurement under it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from tuner.cli.options import err, open_store, settings, terminate_as_interrupt, this_host
from tuner.measure.plan import ProgressEvent

T = TypeVar("T")


class ProgressDisplay:
    """Renders profiler events as a rich progress bar with configuration, level, repeat and ETA."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=err,
            # The bar only on a terminal: in a log or a redirected stderr its last frame would be
            # left behind as a fragment; the lines below say the same there.
            disable=not err.is_terminal,
        )
        self.task = self.progress.add_task("starting", total=None)

    def __enter__(self) -> ProgressDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def __call__(self, event: ProgressEvent) -> None:
        if event.kind == "plan":
            # Each phase (a profile's passes, an adaptive round, a sweep of tune) plans its
            # own rounds: the count starts again, so done / planned always adds up.
            self.progress.reset(self.task, total=event.total)
        elif event.kind in ("server", "kernel", "message"):
            self.progress.console.print(f"[cyan]{event.text}[/]", highlight=False)
            self.progress.update(self.task, description=event.text[:40])
        elif event.kind == "repeat":
            f = event.figures
            tps = f"{f.tokens_per_second:.1f} tok/s" if f and f.tokens_per_second else "-"
            step = f"{f.step_ms:.1f} ms/step" if f and f.step_ms else ""
            depth = f" depth {event.depth}" if event.depth else ""
            self.progress.update(
                self.task,
                advance=event.advance,
                description=f"{event.config} c={event.concurrency}{depth} "
                f"repeat {event.repeat + 1}",
            )
            self.progress.console.print(
                f"  {event.config:>12} c={event.concurrency:<3}{depth} repeat "
                f"{event.repeat + 1}: {tps} {step}",
                highlight=False,
            )
        elif event.kind == "level":
            self.progress.update(self.task, advance=event.advance)


class LogLines:
    """Renders messages as timestamped log lines on stderr: for a long-running service (`tuner
    watch`) under systemd or docker, where a progress bar would only fill the journal."""

    def __call__(self, event: ProgressEvent) -> None:
        import datetime as dt

        if event.kind in ("server", "kernel", "message") and event.text:
            stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            err.print(f"{stamp} {event.text}", highlight=False, markup=False, soft_wrap=True)


def measure_live(run: Callable[..., T], model: str, **options: Any) -> T:
    """run(store, model, host, log_dir, display, **options): a live measurement of a model's
    configurations (tune, validate) on the database, as this host, with its server logs in the
    log folder, under the progress display; SIGTERM stops it as Ctrl-C does."""
    with terminate_as_interrupt(), ProgressDisplay() as display:
        return run(open_store(), model, this_host(), settings().log_dir, display, **options)
