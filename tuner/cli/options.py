"""What every command shares: settings (with --db), the database, this host's name, the options
defined once (--model, --host, --format as enums), spec files with --set, and error handling.

Only the CLI reads the environment (tuner.settings) and turns errors into exit codes; library
functions are handed what they need.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import socket
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from tuner.errors import TunerError
from tuner.recommendation import ObjectiveKind
from tuner.settings import Settings, get_settings

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])


class State:
    """Options given before the command (set by the app callback)."""

    db: str | None = None


def settings() -> Settings:
    """TUNER_* settings, with --db applied."""
    current = get_settings()
    if State.db:
        current.db = State.db
    return current


def open_store():
    """The database named by --db / TUNER_DB / the default, migrated to the newest schema."""
    from tuner.storage.store import Store

    current = settings()
    return Store(current.db, busy_timeout_s=current.db_busy_timeout_s)


def this_host() -> str:
    """This machine's name as results are stored under it (TUNER_HOST_NAME, else the hostname)."""
    return settings().host_name or socket.gethostname()


def model_host(host: str | None) -> tuple[str, bool]:
    """The host to read results of (default: this machine) and whether the user named it."""
    return (host, True) if host else (this_host(), False)


def reports_errors(func: F) -> F:
    """Turn a TunerError into one message on stderr and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TunerError as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a fleet's scheduler, `kill`) stops a run like Ctrl-C does: the run is marked
    interrupted, its llama-server stopped, and completed repeats are kept for --resume."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def note(text: str | None) -> None:
    if text:
        err.print(f"[yellow]note:[/] {text}", highlight=False, soft_wrap=True)


# --- spec files -----------------------------------------------------------------------------


def bench_refs() -> dict[str, Path]:
    from tuner.bench import load_bench

    return load_bench(settings().bench_manifest_path).as_refs()


def parsed_overrides(overrides: list[str] | None) -> list[tuple[str, Any]]:
    from tuner.measure.spec import parse_override

    return [parse_override(o) for o in overrides or []]


def load_spec_file(path: Path, overrides: list[str] | None = None, check_files: bool = True):
    from tuner.measure.spec import load_spec

    return load_spec(path, parsed_overrides(overrides), bench_refs, check_files=check_files)


def levels_option(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: expected comma-separated integers, e.g. 1,2,4,8", param_hint="--levels"
        ) from None


def duration_option(text: str, name: str) -> float:
    """`600`, `600s`, `10m` or `1h` as seconds; 0 is allowed (off)."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    raw = text.strip().lower()
    scale = units.get(raw[-1:])
    number = raw[:-1] if scale is not None else raw
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: expected a duration such as 600, 600s, 10m or 1h", param_hint=name
        ) from None
    if value < 0:
        raise typer.BadParameter(f"{text!r}: must be 0 or more", param_hint=name)
    return value


# --- options defined once -------------------------------------------------------------------


class TableFormat(StrEnum):
    """How fit, predict and validate print: a table for people, JSON for programs."""

    TABLE = "table"
    JSON = "json"


ModelOption = Annotated[str, typer.Option("--model", help="model name (see `tuner runs`)")]
HostOption = Annotated[
    str | None, typer.Option(help="host whose results to use (default: this machine)")
]
TableFormatOption = Annotated[TableFormat, typer.Option("--format", help="table or json")]
FitOption = Annotated[int | None, typer.Option("--fit", help="use this stored fit")]
SeedOption = Annotated[int, typer.Option(help="seed of the fit's bootstrap (and the study)")]
ContextOption = Annotated[
    int | None,
    typer.Option(
        "--context",
        min=0,
        help="context depth (tokens per stream) whose measurements to use; default the "
        "shallowest measured (`tuner fit` lists the depths)",
    ),
]
OverridesOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="override a spec value, e.g. --set workload.max_repeats=2",
    ),
]


class ApplyWay(StrEnum):
    """How `tuner watch` applies a new answer (tuner.decide.watch)."""

    ENV = "env"
    LIVE = "live"


class Switch(StrEnum):
    """How drafting policies are switched between rounds (tuner.measure.backend)."""

    AUTO = "auto"
    LIVE = "live"
    RELAUNCH = "relaunch"


SwitchOption = Annotated[
    Switch,
    typer.Option(
        "--switch",
        help="how drafting policies are switched: live (one drafting launch, the threshold set "
        "through POST /props, needs the patched server; fails if it does not read back), "
        "relaunch (a launch per policy, any server), auto (live where the switch reads back and "
        "the draft counters follow it, else relaunch, and says so)",
    ),
]
SkipPreflightOption = Annotated[
    bool,
    typer.Option(
        "--skip-preflight",
        help="do not first launch each configuration for one short request (the preflight "
        "makes a server that cannot run here fail in seconds, with nothing stored)",
    ),
]
TrafficOption = Annotated[
    str | None,
    typer.Option(
        "--traffic",
        help="weight the objective by this observed traffic profile (`tuner observe`); tpot "
        "and capacity take its arrival rate and output lengths",
    ),
]
ObjectiveOption = Annotated[
    ObjectiveKind,
    typer.Option(
        "--objective",
        help="tps: served tok/s; tpot: mean time per output token under random arrivals; "
        "capacity: highest arrival rate within --slo-tpot-ms at p95",
    ),
]
SloOption = Annotated[
    float | None,
    typer.Option("--slo-tpot-ms", help="capacity: the p95 time per output token to keep (ms)"),
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(envvar="TUNER_API_KEY", show_envvar=True, help="bearer token (never stored)"),
]
