"""The command line's shape: `tuner --help` shows the user's path in the order of use with the
developer's commands under `tuner dev`, no command name twice, advanced options only with
`--help --advanced`, and tables whole when written to a pipe.

Help is read through Typer's runner (in process); the table test runs `tuner` as a subprocess
whose stdout is a pipe, as in a CI log.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from tunerproc import REPO, tuner_cmd, tuner_env
from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.cli.options import ADVANCED

PATH = ["profile", "tune", "recommend", "report", "observe", "watch"]
DEVELOPER = ["fit", "predict", "import", "hosts", "twin"]
SEED = REPO / "profiles" / "reference" / "seed-qwen3.8-flash-next-gfx1151.toml"

runner = CliRunner()


def helped(*args: str) -> str:
    result = runner.invoke(app, [*args], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    return result.stdout


def listed_commands(help_text: str) -> list[str]:
    """The command names a group's help lists, in order (rows of its command panels)."""
    return re.findall(r"^│ ([a-z][a-z-]*)\s{2,}", help_text, flags=re.MULTILINE)


def listed_options(help_text: str) -> set[str]:
    """The options a command's help lists (rows of its option panels, not mentions in text)."""
    return set(re.findall(r"^│\s+(?:\*\s+)?(--[a-z][a-z-]*)", help_text, flags=re.MULTILINE))


def leaves(
    command: Any = None, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command a user can run: its words after `tuner`, and the click command."""
    command = command if command is not None else typer.main.get_command(app)
    subcommands = getattr(command, "commands", None)
    if subcommands is None:
        yield path, command
        return
    for name, sub in subcommands.items():
        yield from leaves(sub, (*path, name))


def test_the_root_help_shows_the_path_in_the_order_of_use() -> None:
    text = helped("--help")
    names = listed_commands(text)
    assert [n for n in names if n in PATH] == PATH, names
    assert "dev" in names and not set(DEVELOPER) & set(names), names
    typical = text[text.index("Typical use") :]
    steps = ["tuner check --url", "tuner tune --url", "tuner recommend", "tuner report", "watch"]
    positions = [typical.index(step) for step in steps]
    assert positions == sorted(positions), typical


def test_developer_commands_are_under_dev() -> None:
    assert listed_commands(helped("dev", "--help")) == DEVELOPER
    assert set(listed_commands(helped("dev", "twin", "--help"))) == {"serve", "truth", "calibrate"}
    moved = runner.invoke(app, ["fit", "--model", "m"])
    assert moved.exit_code == 2 and "No such command 'fit'" in moved.output


def test_no_command_name_appears_twice() -> None:
    names = [path[-1] for path, _ in leaves()]
    assert len(names) == len(set(names)), sorted(names)


def test_tune_help_hides_the_advanced_options_until_asked() -> None:
    plain = helped("tune", "--help")
    assert "--tie-budget" not in listed_options(plain) and "--budget" in listed_options(plain)
    assert "--advanced" in plain
    for asked in (["--help", "--advanced"], ["--advanced", "--help"], ["--advanced"]):
        text = helped("tune", *asked)
        assert {"--tie-budget", "--budget"} <= listed_options(text), asked
        assert f"─ {ADVANCED} ─" in text and text.index("--budget") < text.index("--tie-budget")


def test_every_advanced_option_is_listed_only_with_advanced() -> None:
    seen = 0
    for path, command in leaves():
        hidden = {p.opts[0] for p in command.params if getattr(p, "hidden", False)}
        if not hidden:
            continue
        seen += len(hidden)
        assert not hidden & listed_options(helped(*path, "--help")), path
        assert hidden <= listed_options(helped(*path, "--help", "--advanced")), path
    assert seen >= 10  # budgets, seeds, switch mode, fit ids, preflight skips, overrides


def test_an_advanced_option_is_still_parsed(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    result = runner.invoke(app, ["--db", db, "tune", "--model", "m", "--tie-budget", "soon"])
    assert result.exit_code == 2 and "--tie-budget" in result.stderr, result.output


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        tuner_cmd(*args), env=env, capture_output=True, text=True, check=True, timeout=120
    )


@pytest.fixture
def piped_env(tmp_path: Path) -> dict[str, str]:
    """A tuner subprocess's environment with COLUMNS unset, as in a CI job or `| tee`."""
    env = tuner_env(tmp_path / "cli.db", tmp_path / "cache")
    env.pop("COLUMNS")
    return env


def test_tables_written_to_a_pipe_are_whole(piped_env: dict[str, str]) -> None:
    """The measured table is wider than 80 columns: written to a pipe it is neither cut ("…")
    nor wrapped; with COLUMNS set it fits in that many."""
    table = run(["dev", "import", str(SEED)], piped_env).stdout
    assert "…" not in table
    header = next(line for line in table.splitlines() if "tok/s (±%)" in line)
    assert header.count("tok/s (±%)") == 3 and "max-slots-2" in table
    assert "38.7" in table and max(len(line) for line in table.splitlines()) > 80
    narrow = run(["show", "1"], {**piped_env, "COLUMNS": "60"}).stdout
    assert max(len(line) for line in narrow.splitlines()) <= 60
