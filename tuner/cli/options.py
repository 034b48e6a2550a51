"""What every command shares: the consoles, settings (with --db), the database, this host's name,
the options defined once (--model, --host, --format as enums, and every option more than one
command takes), the advanced options (hidden from --help unless --advanced), options that do not
apply, spec files with --set, and error handling.

Only the CLI reads the environment (tuner.settings) and turns errors into exit codes; library
functions are handed what they need.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import signal
import socket
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from typer.core import TyperCommand

from tuner.errors import ConfigError, TunerError
from tuner.recommendation import ObjectiveKind
from tuner.settings import Settings, get_settings

F = TypeVar("F", bound=Callable[..., Any])

# Wide enough for any table the commands print: rich lays a table out at its natural width and
# only shrinks it (cutting headers and numbers to "…") when the console is narrower.
UNBOUNDED_WIDTH = 4096


class _Console(Console):
    """A rich console that, writing to a file or a pipe (a CI log, `| tee`), is as wide as what
    it prints, as pytest and hyperfine are, instead of rich's 80 columns; in a terminal, or with
    COLUMNS set, it is as wide as that says."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is None and not self.is_terminal and not _columns_set():
            return ConsoleDimensions(UNBOUNDED_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


def _columns_set() -> bool:
    return os.environ.get("COLUMNS", "").strip().isdigit()


out = _Console(soft_wrap=True)
err = _Console(stderr=True, soft_wrap=True)


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


# --- advanced options: hidden from --help unless --advanced ----------------------------------

ADVANCED = "Advanced"  # the help panel they are listed in
_ADVANCED_FLAG = "--advanced"


def advanced(*param_decls: str, **kwargs: Any) -> Any:
    """typer.Option for an option most runs never need (budgets of the inner steps, seeds, the
    switch mode, overrides of the spec): left out of --help, listed under "Advanced" by
    `--help --advanced`. It is parsed like any other option."""
    return typer.Option(*param_decls, hidden=True, rich_help_panel=ADVANCED, **kwargs)


class TunerCommand(TyperCommand):
    """A command whose --help leaves out its advanced options (those declared with advanced())
    and whose `--help --advanced` (in either order, or --advanced alone) lists them too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shown: list[Any] | None = None
        if any(_is_advanced(param) for param in self.params):
            self.epilog = "Advanced options: add --advanced to --help."
        if self.help:  # a docstring's paragraphs rewrapped to the terminal, not at 100 columns
            self.help = "\n\n".join(" ".join(part.split()) for part in self.help.split("\n\n"))

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        end = args.index("--") if "--" in args else len(args)
        if _ADVANCED_FLAG in args[:end]:
            ctx.meta[ADVANCED] = True
            args = ["--help", *(a for i, a in enumerate(args) if i >= end or a != _ADVANCED_FLAG)]
        return super().parse_args(ctx, args)

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        epilog = self.epilog
        if ctx.meta.get(ADVANCED):
            self.epilog = None  # they are listed
        try:
            super().format_help(ctx, formatter)
        finally:
            self.epilog = epilog

    def get_params(self, ctx: typer.Context) -> list[Any]:
        params = super().get_params(ctx)
        if not ctx.meta.get(ADVANCED):
            return params
        if self._shown is None:  # the same objects every call: click orders eager ones by them
            self._shown = [_unhidden(p) if _is_advanced(p) else p for p in params]
        return self._shown


def _is_advanced(param: Any) -> bool:
    return getattr(param, "hidden", False) and getattr(param, "rich_help_panel", None) == ADVANCED


def _unhidden(param: Any) -> Any:
    shown = copy.copy(param)
    shown.hidden = False
    return shown


class Commands(typer.Typer):
    """A Typer app whose commands are TunerCommands (so every command takes --help --advanced)."""

    def command(self, name: str | None = None, *, cls: Any = None, **kwargs: Any) -> Any:
        return super().command(name, cls=cls or TunerCommand, **kwargs)


# --- options that do not apply -----------------------------------------------------------------


def given(ctx: typer.Context, name: str) -> bool:
    """Whether the user gave the option (parameter `name`) on the command line: not its default,
    nor an environment variable."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "PROMPT")


def refuse(ctx: typer.Context, why: str, *names: str) -> None:
    """A ConfigError naming the first of the options `names` the user gave, where they do not
    apply (`why`): an option accepted and then ignored misleads more than an error."""
    for name in names:
        if given(ctx, name):
            flag = next(p.opts[0] for p in ctx.command.params if p.name == name)
            raise ConfigError(f"{flag} does not apply here: {why}")


def http_url(url: str) -> str:
    """--url checked: an http:// or https:// URL."""
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url {url!r}: must be an http:// or https:// URL")
    return url


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


def _model_name(value: str | None) -> str | None:
    """--model takes the name data are stored under or the GGUF file it came from."""
    from tuner.measure.client import model_stem

    return model_stem(value) if value else value


ModelOption = Annotated[
    str,
    typer.Option(
        "--model",
        callback=_model_name,
        help="model name (see `tuner runs`): a server's alias, or its GGUF file's path or stem",
    ),
]
HostOption = Annotated[
    str | None, typer.Option(help="host whose results to use (default: this machine)")
]
TableFormatOption = Annotated[TableFormat, typer.Option("--format", help="table or json")]
FitOption = Annotated[int | None, advanced("--fit", help="use this stored fit")]
SeedOption = Annotated[int, advanced("--seed", help="seed of the fit's bootstrap (and the study)")]
ContextOption = Annotated[
    int | None,
    typer.Option(
        "--context",
        min=0,
        help="context depth (tokens per stream) whose measurements to use; default the "
        "shallowest measured (`tuner dev fit` lists the depths)",
    ),
]
OverridesOption = Annotated[
    list[str] | None,
    advanced(
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
    advanced(
        "--switch",
        help="how drafting policies are switched: live (one drafting launch, the threshold set "
        "through POST /props, needs the patched server; fails if it does not read back), "
        "relaunch (a launch per policy, any server), auto (live where the switch reads back and "
        "the draft counters follow it, else relaunch, and says so)",
    ),
]
SkipPreflightOption = Annotated[
    bool,
    advanced(
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
TuneNMaxOption = Annotated[
    bool,
    advanced(
        "--tune-n-max",
        help="also choose --spec-draft-n-max (1..profiled): recommend searches (N, n_max), tune "
        "settles N at the draft length that search chose",
    ),
]
UrlOption = Annotated[
    str, typer.Option(help="the running llama-server, e.g. http://127.0.0.1:8080")
]
ResumeOption = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="continue the last unfinished run of this spec or model instead of starting over "
        "(finished rounds are kept)",
    ),
]
