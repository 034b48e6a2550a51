"""Advice that runs: each kind of command the tuner suggests, taken from what it printed and
run as written (durations shortened, placeholders filled with the servers at hand) against
twin servers started with llama-server's command line:

- check's fix line: the server started again with the flag it names passes the check;
- an answer from a running server: the command it says measures more (`tune --url ...`) runs;
- no data yet: the command the error names (`tune --url URL`) runs, and then there are data.

Every other output of the suite is held to the weaker rule that its suggestions parse
(tests/outputcheck.py)."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from outputcheck import suggestions
from test_tune_url import twin
from typer.testing import CliRunner, Result

from tuner.cli import app

ALIAS = "twin-Qwen3.8-Flash-Next"
SHORT = ["--set", "workload.max_tokens=32", "--profile-budget", "0", "--budget", "5s"]


def tuner(*args: str) -> Result:
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    return result


def run_suggested(command: str, *extra: str) -> Result:
    """A suggested `tuner ...` line, run as written plus extra (short durations)."""
    words = shlex.split(command)
    assert words[0] == "tuner", command
    return tuner(*words[1:], *extra)


@pytest.mark.parametrize(
    ("started", "missing"),
    [
        (["--model-draft", "d.gguf", "--spec-type", "draft-simple", "--metrics"], "--props"),
        (["--model-draft", "d.gguf", "--props", "--metrics"], "--spec-type draft-simple"),
    ],
    ids=["no-props", "draft-model-without-spec-type"],
)
def test_checks_fix_line_is_what_makes_the_check_pass(started: list[str], missing: str) -> None:
    with twin(*started) as server:
        before = tuner("check", "--url", server.url)
    (failed,) = [line for line in before.stdout.splitlines() if line.startswith("fail ")]
    assert before.exit_code == 1 and missing in failed.split("fix:", 1)[1], failed
    with twin(*started, *shlex.split(missing)) as server:
        after = tuner("check", "--url", server.url)
    assert after.exit_code == 0, after.stdout


def test_an_answer_from_a_running_server_names_a_tune_that_runs() -> None:
    patched = ["--model-draft", "d.gguf", "--spec-type", "draft-simple", "--props", "--metrics"]
    with twin(*patched) as server:
        missing = tuner("recommend", "--model", ALIAS)
        (first,) = [c for c in suggestions(missing.output) if c.startswith("tuner tune --url")]
        created = run_suggested(first.replace("URL", server.url), *SHORT)
        assert created.exit_code == 0, created.output
        shown = tuner("recommend", "--model", ALIAS, "--format", "json", "-q")
        command = json.loads(shown.stdout)["measure_command"]
        assert command == f"tuner tune --url {server.url} --model {ALIAS}"
        again = run_suggested(command, *SHORT)
    assert again.exit_code == 0, again.output
    assert re.search(r"answer: N=\d", again.stdout), again.stdout
    # the command for data from a spec's launches does not fit them: it says which does
    wrong = tuner("tune", "--model", ALIAS)
    (line,) = [s for s in wrong.output.splitlines() if s.startswith("error:")]
    assert f"`tuner tune --url {server.url} --model {ALIAS}` measures it there" in line
