"""The progress display of long runs (profile, validate): a rich progress bar with configuration,
level, repeat and ETA, and one line per finished repeat."""

from __future__ import annotations

from tuner.cli.options import err
from tuner.measure.plan import ProgressEvent


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
