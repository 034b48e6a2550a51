"""What every tuner output the suite sees must hold, checked where the tests collect it
(tunerproc.finish for subprocesses, conftest's wrap of CliRunner.invoke for in-process runs):

- no nan or inf in anything a user reads: a figure the data cannot give is said in words
  ("not measured at 3 streams"), never printed as a number that is not one;
- every command it suggests (`tuner ...` between backticks) parses as a tuner command line:
  the command exists and takes every option given, placeholders (URL, FILE, NAME...) standing
  for values. tests/test_advice_runs.py runs each kind of suggestion for real.

A test whose output breaks either fails, with the offending lines.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

# A bare nan or inf as a number prints it (+nan, -inf, NaN, Infinity), not a word that holds
# those letters (info, inference, infinite, nanoseconds, a model called nano-...).
NONFINITE = re.compile(r"(?<![\w.-])[+-]?(?:nan|inf|infinity)(?![\w-])", re.IGNORECASE)
SUGGESTION = re.compile(r"`(tuner [^`]+)`")
# Placeholders a suggestion may use for what only the user knows, and a value each parses as.
PLACEHOLDERS = {
    "URL": "http://127.0.0.1:8080",
    "URL2": "http://127.0.0.1:8081",
    "FILE": "server.env",
    "FILE.toml": "table.toml",
    "SPEC": "spec.toml",
    "SPEC.toml": "spec.toml",
    "NAME": "model",
    "M": "model",
    "KEY": "key",
    "RUN": "1",
    "DIR": "out",
    "HOST": "host",
    "N": "2",
}


def nonfinite_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if NONFINITE.search(line)]


def suggestions(text: str) -> list[str]:
    return [m.group(1).strip() for m in SUGGESTION.finditer(text)]


def suggestion_problem(command: str) -> str | None:
    """Why a suggested `tuner ...` command line would not parse (None where it does). A command
    or group named in passing, with nothing after it (`tuner observe`), need only exist."""
    import typer.main

    from tuner.cli.app import app

    try:
        words = shlex.split(command)
    except ValueError as exc:
        return f"not a command line: {exc}"
    if words[:1] != ["tuner"]:
        return "does not start with `tuner`"
    args = [PLACEHOLDERS.get(w, w) for w in words[1:] if w not in ("...", "[...]")]
    command_obj = typer.main.get_command(app)
    ctx = command_obj.make_context("tuner", list(args), resilient_parsing=True)
    rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
    while hasattr(command_obj, "get_command"):
        if not rest:
            return None  # a group named in passing
        name, rest = rest[0], rest[1:]
        sub = command_obj.get_command(ctx, name)
        if sub is None:
            return f"no such command: {name}"
        command_obj = sub
        if not rest:
            return None  # a command named in passing
        leaf = not hasattr(sub, "get_command")
        try:
            ctx = sub.make_context(name, list(rest), parent=ctx, resilient_parsing=not leaf)
        except Exception as exc:  # click's UsageError and its kin
            return f"{type(exc).__name__}: {exc}"
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
    return None


def check_output(text: str, where: str, allow_nonfinite: bool = False) -> None:
    """AssertionError naming what breaks the rules above."""
    problems: list[str] = []
    if not allow_nonfinite:
        problems += [f"nan/inf in output: {line.strip()}" for line in nonfinite_lines(text)]
    for command in dict.fromkeys(suggestions(text)):
        why = suggestion_problem(command)
        if why is not None:
            problems.append(f"suggested `{command}` does not parse: {why}")
    if problems:
        raise AssertionError(f"{where}:\n" + "\n".join(problems))


def check_all(texts: Iterable[str], where: str) -> None:
    check_output("\n".join(texts), where)
