"""PostgreSQL as the shared database of a fleet: every command, migrations, a live run and resume.

Runs against the real PostgreSQL server that scripts/test.sh starts (scripts/postgres.sh), one
fresh database per test (the pg_url fixture). The fleet tests in test_fleet.py run on PostgreSQL
too (concurrent writers, the soak, per-host results).
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
import typer
from benchdata import store_profile
from fleetkit import (
    REPO,
    assert_kept,
    assert_no_servers,
    assert_run_complete,
    levels,
    peek,
    profile_args,
    running_level,
    runs,
    snapshot,
    wait_for,
)
from sqlalchemy import create_engine, inspect
from tunerproc import (
    TWIN_MODEL,
    assert_env_line_is,
    finish,
    run_tuner,
    start_tuner,
    tuner_env,
    twin_spec_args,
)
from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.storage.store import VERSION_TABLE, Store, optuna_storage

pytestmark = pytest.mark.postgres

REFERENCE = REPO / "profiles" / "reference" / "seed-qwen3.8-flash-next-gfx1151.toml"
REFERENCE_MODEL = "Qwen3.8-Flash-Next"

# Every command that opens the database, with an invocation against the imported reference
# data; `profile` and `validate` run live below (and profile in test_fleet.py).
COMMANDS: dict[str, list[str]] = {
    "dev import": ["dev", "import", str(REFERENCE)],
    "runs": ["runs"],
    "show": ["show", "1"],
    "dev hosts": ["dev", "hosts"],
    "dev fit": ["dev", "fit", "--model", REFERENCE_MODEL],
    "dev predict": ["dev", "predict", "--model", REFERENCE_MODEL, "--max-slots", "2"],
    "recommend": ["recommend", "--model", REFERENCE_MODEL, "-q"],
    "report": ["report", "--model", REFERENCE_MODEL, "--out", "{tmp}/report"],
}
LIVE = {"profile", "validate", "tune"}  # launch a server: test_live_commands_on_postgres
# need a server; what they store: test_traffic_profiles_on_postgres, test_watch_state_on_postgres
OBSERVED = {"observe", "watch"}
NO_DATABASE = {"bench setup", "bench where", "check"}  # check reads a server, stores nothing
# `dev twin calibrate --run` reads a stored profile: test_twin_calibrates_from_postgres; serve
# and truth read worlds (truth --traffic reads a traffic profile, as recommend --traffic does)
TWIN = {"dev twin serve", "dev twin truth", "dev twin calibrate"}


def command_paths() -> set[str]:
    """Every command a user can run, as its words after `tuner` ("dev twin serve")."""

    def walk(command, path: list[str]):
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            yield " ".join(path)
            return
        for name, sub in subcommands.items():
            yield from walk(sub, [*path, name])

    return set(walk(typer.main.get_command(app), []))


def test_every_command_is_covered_here() -> None:
    missing = command_paths() - set(COMMANDS) - LIVE - OBSERVED - NO_DATABASE - TWIN
    assert not missing, f"add a PostgreSQL case for: {', '.join(sorted(missing))}"


@pytest.mark.parametrize("how", ["--db", "TUNER_DB"])
def test_every_command_works_on_postgres(pg_url: str, how: str, tmp_path: Path) -> None:
    runner = CliRunner()
    for name, template in COMMANDS.items():
        args = [arg.replace("{tmp}", str(tmp_path)) for arg in template]
        if how == "--db":
            result = runner.invoke(app, ["--db", pg_url, *args], env={"COLUMNS": "200"})
        else:
            result = runner.invoke(app, args, env={"TUNER_DB": pg_url, "COLUMNS": "200"})
        assert result.exit_code == 0, (name, result.output)
    assert peek(pg_url, "SELECT COUNT(*) FROM tuner_runs") == [(1,)]
    assert peek(pg_url, "SELECT COUNT(*) FROM tuner_fits") == [(1,)]  # recommend reuses it
    assert peek(pg_url, "SELECT COUNT(*) FROM tuner_recommendations") == [(1,)]
    recommended = runner.invoke(app, ["--db", pg_url, *COMMANDS["recommend"]])
    assert recommended.stdout.strip().splitlines()[-1] == "LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=2"
    assert (tmp_path / "report" / "summary.md").exists()


def test_twin_calibrates_from_postgres(pg_url: str, tmp_path: Path) -> None:
    """`tuner twin calibrate --run` reads a profile run stored on PostgreSQL (the imported
    reference table has no tokens per step to calibrate acceptance from, so a stored profile)."""
    store = Store(pg_url)
    store_profile(store, host="host-a")
    store.dispose()
    world = tmp_path / "world.toml"
    result = CliRunner().invoke(
        app, ["--db", pg_url, "dev", "twin", "calibrate", "--run", "1", "--out", str(world)]
    )
    assert result.exit_code == 0, result.output
    assert "N=0    c=8" in result.stdout and world.read_text().strip()
    missing = CliRunner().invoke(
        app, ["--db", pg_url, "dev", "twin", "calibrate", "--run", "99", "--out", str(world)]
    )
    assert missing.exit_code != 0 and "99" in missing.output, missing.output


def test_migrations_and_optuna_share_the_database(pg_url: str) -> None:
    Store(pg_url).dispose()
    Store(pg_url).dispose()  # at head: nothing to do
    optuna_storage(pg_url)
    engine = create_engine(pg_url)
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    ours = {t for t in tables if t.startswith("tuner_")}
    assert {VERSION_TABLE, "tuner_runs", "tuner_levels", "tuner_samples", "tuner_hosts"} <= ours
    assert {"studies", "trials", "alembic_version"} <= tables  # Optuna's, beside ours
    assert peek(pg_url, f"SELECT COUNT(*) FROM {VERSION_TABLE}") == [(1,)]


def test_live_commands_on_postgres(pg_url: str, tmp_path: Path) -> None:
    """A live profile on PostgreSQL, interrupted during a level and resumed to completion; then
    recommend, validate and tune (live) on the same database. Brief: what is tested is that
    every command stores and reads its rows there, not what it measures, so the server is the
    bench's twin (the same launches, switch and HTTP). The profile runs at 4 times the wall's
    speed, slow enough that a level lasts the half second it takes to be interrupted in."""
    cache = tmp_path / "cache"
    env = tuner_env(pg_url, cache)
    args = profile_args("1,2", 48, twin=tmp_path, speed=4.0)
    tuner = start_tuner(args, env)
    wait_for(lambda: running_level(pg_url, "plain", 2), timeout_s=180, interval_s=0.05)
    before = snapshot(pg_url)
    # what the schedule measured before plain at 2 streams (its order is the schedule's)
    assert before.done and ("plain", 2) not in before.done, sorted(before.done)
    tuner.send_signal(signal.SIGINT)
    result = finish(tuner)
    assert result.returncode == 130, result.stderr[-3000:]
    assert_no_servers(f"TUNER_CACHE_DIR={cache}")
    assert runs(pg_url)[0][1] == "interrupted"
    assert levels(pg_url)[("plain", 2)].status == "failed"
    assert_kept(pg_url, before)

    resumed = run_tuner([*args, "--resume"], env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming run 1" in resumed.stderr
    # only plain was left: the resume launched no drafting server to check the switch on
    assert "starting llama-server (drafting" not in resumed.stderr, resumed.stderr
    assert_kept(pg_url, before)
    assert_run_complete(pg_url, 1, (1, 2))

    model = TWIN_MODEL
    recommended = run_tuner(["recommend", "--model", model, "-q"], env)
    assert recommended.returncode == 0, recommended.stderr[-3000:]
    # the answer read back from PostgreSQL, the same in both forms; which answer it is (a
    # threshold, or plain with the threshold as a comment) is what the wall-clock twin's rounds
    # say, not what this test checks
    as_json = run_tuner(["recommend", "--model", model, "--format", "json"], env)
    assert as_json.returncode == 0, as_json.stderr[-3000:]
    stored = json.loads(as_json.stdout)
    assert_env_line_is(recommended.stdout.strip().splitlines()[-1], stored)
    quick = ["--set", "workload.max_tokens=16", "--set", "workload.warmup=0", "--skip-preflight"]
    quick += ["--set", "workload.min_repeats=1", "--set", "workload.max_repeats=1"]
    quick += twin_spec_args(tmp_path, speed=20.0)  # nothing to interrupt from here on
    validated = run_tuner(["validate", "--model", model, *quick], env)
    assert validated.returncode == 0, validated.stderr[-3000:]
    tuned = run_tuner(["tune", "--model", model, "--budget", "5s", *quick], env)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    # its answer printed (settled or not: 5 s on a busy machine may settle nothing) and stored:
    # the answer tune printed is the one recommend reads back from PostgreSQL, whichever answer
    # the wall-clock twin's rounds give (a threshold, or plain with the threshold beside it)
    after = run_tuner(["recommend", "--model", model, "--format", "json", "-q"], env)
    assert after.returncode == 0, after.stderr[-3000:]
    headline = json.loads(after.stdout)["headline"]
    assert re.search(r"^answer: (plain: .*; )?N=\d", tuned.stdout, re.M), tuned.stdout
    assert f"answer: {headline}; " in tuned.stdout, (headline, tuned.stdout)
    kinds = peek(pg_url, "SELECT kind, status FROM tuner_runs ORDER BY id")
    assert kinds == [("profile", "completed"), ("validate", "completed"), ("tune", "completed")]
    assert peek(pg_url, "SELECT COUNT(*) FROM studies WHERE study_name LIKE 'tuner:live:%'") == [
        (1,)
    ]
    assert_no_servers(f"TUNER_CACHE_DIR={cache}")


def test_traffic_profiles_on_postgres(pg_url: str) -> None:
    """What `tuner observe` saves (every 10 s and at the end, adding to an earlier observation of
    the same name) and `recommend --traffic` reads, on PostgreSQL."""
    from tuner.storage.traffic_profiles import TrafficSaver, load
    from tuner.traffic import ServerView, TrafficProfile

    view = ServerView("http://127.0.0.1:8080", "m", 4, "slots")
    store = Store(pg_url)
    first = TrafficProfile(4, {0: 5.0, 2: 10.0})
    saver = TrafficSaver(store, None)
    saver(view, first, False)
    saver(view, first, True)
    assert saver.name == "127.0.0.1:8080/m"
    again = TrafficSaver(store, saver.name)
    again(view, TrafficProfile(4, {2: 10.0, 4: 5.0}), True)
    assert load(store, saver.name).seconds == {0: 5.0, 2: 20.0, 4: 5.0}
    assert peek(pg_url, "SELECT COUNT(*) FROM tuner_traffic") == [(1,)]
    store.dispose()


def test_watch_state_on_postgres(pg_url: str, tmp_path: Path) -> None:
    """What `tuner watch` saves every 10 s (its rolling buckets) and a restarted watcher reads
    back, on PostgreSQL."""
    import time
    from types import SimpleNamespace

    from tuner.decide.watch import EnvFile, Watcher, WatchOptions
    from tuner.traffic import ServerView

    view = ServerView("http://127.0.0.1:8080", "m", 8, "slots")
    poller = SimpleNamespace(view=view, interval_s=0.25)
    options = WatchOptions(every_s=60.0, window_s=180.0)
    store = Store(pg_url)
    env = EnvFile(tmp_path / "server.env")
    first = Watcher(store, poller, env, "watch-pg", options, lambda name: None)  # type: ignore[arg-type]
    now = time.time()
    first.rolling.open(now - 120.0).profile.add(2, 60.0)
    first.rolling.open(now - 60.0).profile.add(5, 60.0)
    first.save()
    again = Watcher(store, poller, env, "watch-pg", options, lambda name: None)  # type: ignore[arg-type]
    assert again.rolling.total().seconds == {2: 60.0, 5: 60.0}
    assert peek(pg_url, "SELECT status FROM tuner_traffic WHERE name = 'watch-pg'") == [
        ("watching",)
    ]
    store.dispose()
