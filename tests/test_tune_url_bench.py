"""`tuner check --url` and `tuner tune --url` against the real bench llama-server started by hand
(the README's own path, check and tune and the threshold given back, runs in
tests/test_readme_path.py): one slot and two; and check's one failing line for a server without
--props, without --metrics, or with an API key the tuner was not given. Short rounds: what is
tested is the path, the server left as found and what the tuner says, never which N (the twin
grades decisions)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from tunerproc import Finished, finish, run_tuner, start_tuner, tuner_env

from tuner.bench import Bench
from tuner.measure.client import LlamaClient
from tuner.measure.launcher import free_port

pytestmark = pytest.mark.bench

QUICK = [
    *("--set", "workload.max_tokens=32", "--set", "workload.min_repeats=1"),
    *("--set", "workload.max_repeats=1", "--set", "workload.warmup=0"),
    *("--profile-budget", "0", "--budget", "10s", "--set", "probes.enabled=false"),
]


@contextmanager
def by_hand(
    bench: Bench, tmp_path: Path, *flags: str, slots: int = 4, found: int = 3
) -> Iterator[str]:
    """The bench's llama-server started as an operator starts theirs, with the threshold
    `found`; its URL."""
    port = free_port()
    cmd = [
        *(str(bench.server), "-m", str(bench.target), "--model-draft", str(bench.draft)),
        *("--spec-type", "draft-simple", "--spec-draft-n-max", "6", "--spec-synth-len", "3.5"),
        *("-np", str(slots), "-c", str(1024 * slots), "-t", "2", "--kv-unified", "--poll", "0"),
        *("--host", "127.0.0.1", "--port", str(port), "--spec-draft-max-slots", str(found)),
        *flags,
    ]
    log = (tmp_path / f"server-{port}.log").open("w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, (tmp_path / f"server-{port}.log").read_text()[-2000:]
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def threshold(url: str) -> int | None:
    with LlamaClient(url) as api:
        return api.max_slots()


def tuner(tmp_path: Path, *args: str, timeout_s: float = 900) -> Finished:
    env = tuner_env(tmp_path / "tuner.db", tmp_path / "cache", TUNER_STATE_DIR=str(tmp_path))
    return run_tuner(args, env, timeout_s)


def test_one_slot_on_the_bench_says_the_threshold_changes_nothing(
    bench: Bench, tmp_path: Path
) -> None:
    with by_hand(bench, tmp_path, "--props", "--metrics", slots=1) as url:
        tuned = tuner(tmp_path, "tune", "--url", url, *QUICK)
        after = threshold(url)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    assert "no threshold changes anything here" in tuned.stdout and after == 3


def test_two_slots_on_the_bench_settle_on_the_one_level_that_differs(
    bench: Bench, tmp_path: Path
) -> None:
    with by_hand(bench, tmp_path, "--props", "--metrics", slots=2) as url:
        tuned = tuner(tmp_path, "tune", "--url", url, *QUICK, "--format", "json")
        after = threshold(url)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    report = json.loads(tuned.stdout)["tune"]
    assert {c for comp in report["comparisons"] for c in comp["levels"]} <= {2}
    assert after == 3


@pytest.mark.parametrize(
    ("flags", "extra", "names"),
    [
        (["--metrics"], [], ["--props"]),
        (["--props"], [], ["--metrics"]),
        (["--props", "--metrics", "--api-key", "right"], ["--api-key", "wrong"], ["API key"]),
    ],
    ids=["no-props", "no-metrics", "wrong-key"],
)
def test_check_names_what_a_bench_server_lacks(
    bench: Bench, tmp_path: Path, flags: list[str], extra: list[str], names: list[str]
) -> None:
    with by_hand(bench, tmp_path, *flags) as url:
        checked = tuner(tmp_path, "check", "--url", url, *extra, timeout_s=300)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    failed = [line for line in checked.stdout.splitlines() if line.startswith("fail ")]
    assert len(failed) == 1, checked.stdout
    assert all(name in failed[0] for name in names), failed[0]


def test_a_killed_tune_on_the_bench_is_given_back_by_the_next_run(
    bench: Bench, tmp_path: Path
) -> None:
    env = tuner_env(tmp_path / "tuner.db", tmp_path / "cache", TUNER_STATE_DIR=str(tmp_path))
    with by_hand(bench, tmp_path, "--props", "--metrics") as url:
        process = start_tuner(["tune", "--url", url, *QUICK], env)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not list(tmp_path.glob("holds/*.json")):
            time.sleep(0.1)  # the record is on the disk before the first switch
        time.sleep(3)
        process.kill()
        finish(process, 30)
        checked = run_tuner(["check", "--url", url], env, 300)
        after = threshold(url)
    assert after == 3, checked.stderr
    assert "restored spec_draft_max_slots=3" in checked.stderr, checked.stderr
