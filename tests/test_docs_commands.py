"""Every `tuner` command the README and docs/ name exists and takes every option they give it.

A page that names a command or an option the CLI no longer has sends a user to an error; the
README's own-server section is run for real (tests/test_readme_path.py), the rest are held
here against the CLI itself: the words after `tuner` walk the command groups to a command,
and each `--option` (or `-x`) on the line must be one of that command's; a file of this
repository it names (profiles/..., scripts/...) must be there. Lines are taken from
code blocks (fenced or indented, continuation lines joined) and from inline `tuner ...` spans;
what is shell around them (a redirection, a pipe, a comment) is not the tuner's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer.main

from tuner.cli.app import app

REPO = Path(__file__).resolve().parent.parent
# docs/results.md is generated: its commands are the benchmarks', not the tuner's
PAGES = [
    REPO / "README.md",
    *sorted(set((REPO / "docs").glob("*.md")) - {REPO / "docs/results.md"}),
]
# every command's help, and its advanced options' (tuner.cli.options.TunerCommand)
HELP = {"--help", "--advanced"}
REPO_PATH = re.compile(r"(?:profiles|benchmarks|scripts|docs|db|patches)/[\w./-]+")
SHELL_END = re.compile(r"\s(?:>>?|\||&&|;|#|2>)\s?")
TUNER = re.compile(r"(?:^|[\s;(&|])(?:\S*/)?(tuner\s.*)$")


def command_lines(text: str) -> list[str]:
    """The `tuner ...` command lines a page shows."""
    found = [m.group(1) for m in re.finditer(r"`(tuner [^`]+)`", text)]
    fenced = False
    pending = ""
    for raw in text.splitlines():
        if raw.strip().startswith("```"):
            fenced, pending = not fenced, ""
            continue
        if not (fenced or raw.startswith("    ")):
            pending = ""
            continue
        line = f"{pending} {raw.strip()}".strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        m = TUNER.search(line)
        if m:
            found.append(m.group(1))
    return [" ".join(SHELL_END.split(line, maxsplit=1)[0].split()) for line in found]


def problem(line: str) -> str | None:
    """Why a documented command line names what the CLI lacks (None where it does not)."""
    words = [w.strip("[]'\"") for w in line.split()[1:]]
    for word in words:  # a file of this repository the line names must be there
        yours = "/my-" in word  # the user's own file in an example (profiles/my-model.toml)
        if REPO_PATH.fullmatch(word) and not yours and not (REPO / word).exists():
            return f"no such file in the repository: {word}"
    command: Any = typer.main.get_command(app)
    path = ["tuner"]
    while hasattr(command, "get_command"):  # a group (typer's own click)
        name = next((w for w in words if w and not w.startswith("-")), None)
        if name is None or words.index(name) != 0:
            return None  # a group named in passing (`tuner dev`), or its own options
        sub = command.get_command(command.make_context(path[-1], [], resilient_parsing=True), name)
        if sub is None:
            return f"`{' '.join(path)}` has no command {name!r}"
        command, path, words = sub, [*path, name], words[1:]
    options = HELP | {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    for word in words:
        for part in word.split("|"):  # --format env|json, [--apply env|live]
            flag = part.split("=", 1)[0]
            if re.fullmatch(r"--?[a-zA-Z][\w-]*", flag) and flag not in options:
                return f"`{' '.join(path)}` has no option {flag}"
    return None


def test_the_reader_finds_commands_and_their_options() -> None:
    page = (
        "Run `tuner tune --url URL` first.\n\n"
        "    LLAMA_ARG_X=1 .venv/bin/tuner recommend --model NAME \\\n"
        "        --format env >> /etc/llama/server.env\n\n"
        "```sh\ntuner watch --model m [--apply env|live]  # a comment\n```\n"
    )
    assert command_lines(page) == [
        "tuner tune --url URL",
        "tuner recommend --model NAME --format env",
        "tuner watch --model m [--apply env|live]",
    ]
    assert problem("tuner tune --url URL") is None
    assert problem("tuner watch --model m [--apply env|live]") is None
    assert problem("tuner dev twin serve WORLD --plain") is None
    assert problem("tuner dev") is None
    assert problem("tuner tune --no-such-flag") == "`tuner tune` has no option --no-such-flag"
    assert problem("tuner dev twin serv WORLD") == "`tuner dev twin` has no command 'serv'"
    assert problem("tuner profile profiles/nothing.toml") == (
        "no such file in the repository: profiles/nothing.toml"
    )


def test_every_documented_command_exists_with_its_options() -> None:
    lines = {page: dict.fromkeys(command_lines(page.read_text())) for page in PAGES}
    assert sum(map(len, lines.values())) > 50  # the pages show many; none found is a broken reader
    problems = [
        f"{page.relative_to(REPO)}: `{line}`: {why}"
        for page, found in lines.items()
        for line in found
        if (why := problem(line)) is not None
    ]
    assert not problems, "\n".join(problems)
