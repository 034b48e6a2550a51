"""The README's own-server section, run as written against the bench: start the drafting server
(step 2), check it (3), tune it, start a second server without the draft model and tune again
with --plain-url (4), recommend in every format, report and watch --apply live (5). Each command
is the README's own ```sh line with only these substituted:

- paths: llama-server, model.gguf and draft.gguf by the bench's (`tuner bench where`), the env
  file and the report folder by the test's own, `tuner` by this interpreter's;
- ports: 8080 and 8081 by free ones;
- NAME: the name `check`'s model line says the data go under;
- durations: tune's budgets, round lengths and repeats, and watch's intervals, shortened
  (DURATIONS); nothing that changes what a command does.

What is checked: every command's exit status; the threshold given back after each tune; and
one answer on every surface (recommend's text, env, json, args and systemd forms, the report's
title, watch's first lines). Which N comes out is not checked: the twin grades decisions. The
suggested commands the outputs hold parse (tests/outputcheck.py, for every output)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from readme import Step, readme_commands, threshold, walk
from tunerproc import Finished, tuner_env

from tuner.bench import Bench
from tuner.measure.client import model_stem
from tuner.measure.launcher import free_port

pytestmark = pytest.mark.bench

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
# What the test adds to a command of the README to make it short: budgets and round lengths.
DURATIONS = {
    "tune": [
        *("--budget", "10s", "--profile-budget", "0", "--wait", "20s", "--tie-budget", "0"),
        *("--plain-budget", "10s"),
        *("--set", "workload.max_tokens=32", "--set", "workload.min_repeats=1"),
        *("--set", "workload.max_repeats=1", "--set", "workload.warmup=0"),
        *("--set", "probes.enabled=false"),
    ],
    "watch": ["--duration", "12s", "--every", "6s", "--window", "6s"],
}


def test_the_readme_own_server_section_runs_as_written(bench: Bench, tmp_path: Path) -> None:
    commands = readme_commands()
    assert commands[0].startswith("llama-server") and "--spec-type draft-simple" in commands[0]
    ports = {"8080": str(free_port()), "8081": str(free_port())}
    env = tuner_env(tmp_path / "tuner.db", tmp_path / "cache", TUNER_STATE_DIR=str(tmp_path))
    name = model_stem(str(bench.target))

    def checked(step: Step) -> None:
        assert step.result is not None
        if step.line.startswith("tuner check"):
            seen = re.search(r"model\s+(\S+) \(the name its data go under", step.result.stdout)
            assert seen and seen.group(1) == name, step.result.stdout
        if step.line.startswith("tuner tune"):
            # the threshold the server was started with, given back
            assert threshold(f"http://127.0.0.1:{ports['8080']}") == 0

    steps = walk(bench, tmp_path, env, ports, name, DURATIONS, after=checked)
    one_answer({s.line: s.result for s in steps if s.result is not None}, tmp_path)


def one_answer(said: dict[str, Finished], tmp: Path) -> None:
    """Every surface states the same answer and status."""
    out = {line.split("--format ")[1].split()[0] if "--format" in line else line: r.stdout
           for line, r in said.items() if line.startswith("tuner recommend")}  # fmt: skip
    text = out["text"].strip()
    data = json.loads(out["json"])
    assert data["headline"] == text
    assert data["answer"] in ("threshold", "plain")
    assert f"({data['status']}" in text or data["status"] == "settled" or "unresolved" in text
    # what `recommend >> server.env` appended (watch writes its N into the file after it)
    (env_file,) = [r.stdout for line, r in said.items() if ">>" in line]
    if data["answer"] == "plain":
        assert out["args"].strip() == ""
        assert all(line.startswith("#") for line in env_file.splitlines() if line)
    else:
        assert out["args"].split() == ["--spec-draft-max-slots", str(data["max_slots"])]
        assert f"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS={data['max_slots']}" in env_file
        assert f"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS={data['max_slots']}" in out["systemd"]
    if data["status"] == "unresolved":
        # the line that says so comes before the answer's own (after the plain line, where the
        # answer is plain: its status is the threshold's, should the draft model stay)
        comments = env_file.lstrip().splitlines()
        assert comments[1 if data["answer"] == "plain" else 0].startswith("# unresolved"), env_file
    summary = (tmp / "report" / "summary.md").read_text()
    assert f"## Recommendation: {text}" in summary
    assert data["drafting_pays"] is not None, "the second tune measured plain beside it"
    (watch,) = [r for line, r in said.items() if line.startswith("tuner watch")]
    if data["answer"] == "threshold":
        assert f"N={data['max_slots']}" in watch.stderr
