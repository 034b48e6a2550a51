"""`tuner tune --url` (tuner.decide.running): N settled on a llama-server the tuner did not start,
against twin servers started as llama-server is (tuner.twin.server in a thread of this process,
its llama-server command line, noise off): the answer stored under the server's alias, found by
`recommend`; the server's threshold back to what it was on every way out (success, an error,
SIGTERM, SIGKILL then the next run); one slot, two slots; a server that cannot be tuned; a
second tune of a server already held; a threshold switched under the tune's feet.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import func, select
from tunerproc import finish, run_tuner, start_tuner, tuner_env
from twinworlds import SEED_WORLD
from typer.testing import CliRunner, Result

from tuner.cli import app
from tuner.measure.client import LlamaClient
from tuner.measure.hold import ServerHold
from tuner.storage.orm import Sample
from tuner.storage.queries import list_runs
from tuner.storage.store import Store
from tuner.twin.cmdline import launch_world, parse_args
from tuner.twin.server import TwinServer

DRAFTING = ["--model-draft", "draft.gguf", "--spec-type", "draft-simple"]
PATCHED = [*DRAFTING, "--props", "--metrics", "--spec-draft-max-slots", "3"]
ALIAS = "twin-Qwen3.8-Flash-Next"  # the seed world's model name: the server's alias
# Short rounds and no adaptive levels: what is tested is the path and the server left as found;
# which N is right is graded on the twin elsewhere (benchmarks/tune_url.py, test_decisions.py).
QUICK = ["--set", "workload.max_tokens=48", "--profile-budget", "0", "--budget", "60s"]


@contextmanager
def twin(*flags: str, parallel: int = 4, speed: float = 50.0) -> Iterator[TwinServer]:
    """A twin of the seed world (n_max 3) started with llama-server's flags, on a free port."""
    argv = ["--model", str(SEED_WORLD), "--port", "0", "--parallel", str(parallel)]
    argv += ["--noise", "off", "--speed", str(speed), "--seed", "1", *flags]
    args = parse_args(argv, env={})
    world, policy = launch_world(args)
    server = TwinServer(args, world, policy, log=lambda _: None).start_in_thread()
    try:
        yield server
    finally:
        server.stop_thread()


def threshold(url: str) -> int | None:
    with LlamaClient(url) as api:
        return api.max_slots()


def tune_url(*args: str) -> Result:
    result = CliRunner().invoke(app, ["tune", *args])
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_a_running_server_is_tuned_stored_under_its_alias_and_left_as_found() -> None:
    with twin(*PATCHED) as server:
        result = tune_url("--url", server.url, *QUICK, "--format", "json")
        assert threshold(server.url) == 3  # what it had before, given back
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["model"] == ALIAS and report["slots"] == 4 and report["n_max"] == 3
    answer = report["tune"]["standing"]
    assert answer is not None
    # the answer is stored under the alias: recommend finds it with no TOML file anywhere
    shown = CliRunner().invoke(app, ["recommend", "--model", ALIAS, "--format", "json", "-q"])
    assert shown.exit_code == 0, shown.output
    stored = json.loads(shown.stdout)
    assert stored["max_slots"] == answer and stored["source"] == "live"
    codes = [r["code"] for r in stored["reasons"]]
    assert codes[0] == "plain-unmeasured"  # only the threshold was settled, and it says so
    assert stored["drafting_pays"] is None and stored["answer"] == "threshold"
    # what it suggests measures these data where they came from: the running server
    assert stored["measure_command"] == f"tuner tune --url {server.url} --model {ALIAS}"
    # `tuner runs` counts the tune's comparisons, not levels a tune never closes one by one
    store = Store(os.environ["TUNER_DB"])
    shown = {r.kind: r.progress() for r in list_runs(store)}
    store.dispose()
    assert re.fullmatch(r"\d+/\d+ comparisons resolved", shown["tune"]), shown


def test_the_table_and_how_to_apply_it_are_printed() -> None:
    with twin(*PATCHED) as server:
        result = tune_url("--url", server.url, *QUICK)
    assert result.exit_code == 0, result.output
    assert "live comparisons" in result.stdout and "attached-live" in result.stdout
    assert "to apply: set LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=" in result.stdout


def test_one_slot_says_the_threshold_changes_nothing_and_exits_0() -> None:
    with twin(*PATCHED, parallel=1) as server:
        result = tune_url("--url", server.url, *QUICK)
        assert threshold(server.url) == 3
    assert result.exit_code == 0, result.output
    assert "no threshold changes anything here" in result.stdout
    assert "--plain-url" in result.stdout  # what would answer whether drafting pays


def test_one_slot_with_a_plain_server_answers_whether_drafting_pays() -> None:
    with twin(*PATCHED, parallel=1) as server, twin("--metrics", parallel=1) as plain:
        result = tune_url("--url", server.url, "--plain-url", plain.url, *QUICK)
    assert result.exit_code == 0, result.output
    (line,) = [s for s in result.stdout.splitlines() if s.startswith("plain against drafting")]
    # the seed world drafts well at one stream: plain is behind there, with its bounds
    assert "] tok/s" in line and ("drafting is ahead" in line or "unresolved" in line), line


def test_two_slots_settle_between_always_draft_and_one() -> None:
    with twin(*PATCHED, parallel=2) as server:
        result = tune_url("--url", server.url, *QUICK, "--format", "json")
        assert threshold(server.url) == 3
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # with two slots N is 1, or always draft (0, or 2 and above: no limit reached), or plain;
    # every comparison rests on the one level where they differ
    assert report["tune"]["standing"] in (0, 1, 2)
    levels = {c for comp in report["tune"]["comparisons"] for c in comp["levels"]}
    assert levels == {2}, report["tune"]["comparisons"]


def test_a_server_that_cannot_be_tuned_is_one_line_naming_the_fix() -> None:
    with twin(*DRAFTING, "--props", "--metrics", "--twin-unpatched") as server:
        result = tune_url("--url", server.url, *QUICK)
    assert result.exit_code != 0
    (line,) = [s for s in result.output.splitlines() if s.startswith("error:")]
    assert "cannot be tuned live" in line and "spec-draft-max-slots.patch" in line


def test_a_server_refused_before_any_switch_leaves_no_hold_record() -> None:
    """Without --props nothing was switched: nothing to give back, no warning, no record that
    later commands against the URL would trip on."""
    with twin(*DRAFTING, "--metrics", "--spec-draft-max-slots", "3") as server:
        result = tune_url("--url", server.url, *QUICK)
        assert threshold(server.url) == 3
    assert result.exit_code != 0 and "--props" in result.output
    assert "could not give" not in result.output
    assert not list(Path(os.environ["TUNER_STATE_DIR"]).glob("holds/*.json"))


def test_a_plain_url_that_is_the_drafting_server_is_one_line() -> None:
    with twin(*PATCHED) as server:
        same = server.url.replace("127.0.0.1", "localhost")
        result = tune_url("--url", server.url, "--plain-url", same, *QUICK)
        assert threshold(server.url) == 3
    (line,) = [s for s in result.output.splitlines() if s.startswith("error:")]
    assert "is the drafting server itself" in line


def test_a_second_tune_of_a_held_server_is_refused(tmp_path: Path) -> None:
    with twin(*PATCHED) as server:
        with ServerHold(server.url, None, Path(os.environ["TUNER_STATE_DIR"])):
            result = tune_url("--url", server.url, *QUICK)
        assert threshold(server.url) == 3
    assert result.exit_code != 0
    assert "another tuner" in result.output and "one tune at a time" in result.output


def test_a_threshold_switched_under_the_tune_stops_it_and_it_is_given_back() -> None:
    """Someone else (or a restart: the server back at its command line's) switches the
    threshold while the tune measures: the next round's check stops it with one line, and the
    threshold found is set back."""
    with twin(*PATCHED, speed=5.0) as server:
        env = tuner_env(os.environ["TUNER_DB"], Path(os.environ["TUNER_CACHE_DIR"]))
        process = start_tuner(["tune", "--url", server.url, *QUICK], env)
        _wait_for_rounds(server.url, away_from=3)
        _set(server.url, 7)  # not a value the tune would set itself at 4 slots
        result = finish(process, 120)
        assert threshold(server.url) == 3
    assert result.returncode != 0, result.stdout
    assert any("restarted or something else switched it" in e for e in result.error_lines)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_tune_gives_the_threshold_back(how: signal.Signals) -> None:
    with twin(*PATCHED, speed=5.0) as server:
        env = tuner_env(os.environ["TUNER_DB"], Path(os.environ["TUNER_CACHE_DIR"]))
        process = start_tuner(["tune", "--url", server.url, *QUICK], env)
        _wait_for_rounds(server.url, away_from=3)
        process.send_signal(how)
        result = finish(process, 60)
        assert threshold(server.url) == 3, result.stderr[-2000:]
    assert result.returncode != 0
    assert "back to 3, as found" in result.stderr
    if how is signal.SIGINT:  # what it says to do next fits a server it did not start
        assert f"`tuner tune --url {server.url} --model {ALIAS}` again" in result.stderr
        assert "--resume" not in result.stderr


def test_a_killed_tune_is_given_back_by_the_next_run_which_says_so() -> None:
    with twin(*PATCHED, speed=5.0) as server:
        env = tuner_env(os.environ["TUNER_DB"], Path(os.environ["TUNER_CACHE_DIR"]))
        process = start_tuner(["tune", "--url", server.url, *QUICK], env)
        _wait_for_rounds(server.url, away_from=3)
        process.kill()
        finish(process, 30)
        left = threshold(server.url)
        checked = run_tuner(["check", "--url", server.url], env, 60)
        assert threshold(server.url) == 3
    assert left != 3  # the kill left it switched: the record is what gave it back
    assert "restored" in checked.stderr and "3" in checked.stderr, checked.stderr


def _wait_for_rounds(url: str, away_from: int, timeout_s: float = 60.0) -> None:
    """Until the tune measures (a round stored: past the check, whose own switch it sets back)
    with the threshold switched away from the one found."""
    store = Store(os.environ["TUNER_DB"])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            with store.session() as session:
                rounds = session.scalar(select(func.count()).select_from(Sample))
            if rounds and threshold(url) != away_from:
                return
            time.sleep(0.05)
    finally:
        store.dispose()
    raise AssertionError(f"the tune never measured on {url} with its threshold switched")


def _set(url: str, n: int) -> None:
    with LlamaClient(url) as api:
        api.set_max_slots(n)
