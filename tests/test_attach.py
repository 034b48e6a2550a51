"""Attach mode against a real llama-server protected by `--api-key`.

The key is sent as a bearer token (from --api-key or TUNER_API_KEY) and must appear nowhere the
tuner writes: not in the database file, not in the stored spec, not in its logs or output.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleetkit import QUICK, env_for, peek, run_tuner

from tuner.bench import Bench
from tuner.measure.launcher import LaunchConfig, ManagedServer

pytestmark = pytest.mark.bench


@pytest.fixture
def secret() -> str:
    return f"tuner-test-key-{uuid.uuid4().hex}"


@pytest.fixture
def protected_server(bench: Bench, tmp_path: Path, secret: str) -> Iterator[ManagedServer]:
    # The server's own log (it holds its command line, key included) lives outside the
    # tuner's cache dir: it is not the tuner's to keep secret.
    config = LaunchConfig(
        binary=bench.server,
        model=bench.target,
        n_parallel=2,
        ctx_size=1024,
        threads=2,
        args=["--api-key", secret],
    )
    with ManagedServer(config, tmp_path / "outside" / "server.log", start_timeout_s=120) as server:
        yield server


def attach_args(url: str, *extra: str) -> list[str]:
    return [
        "profile",
        "--url",
        url,
        "--label",
        "guarded",
        "--model-name",
        "attached-model",
        "--levels",
        "1,2",
        "--set",
        "workload.max_tokens=16",
        *QUICK,
        *extra,
    ]


def test_api_key_is_sent_and_never_stored(
    tmp_path: Path, protected_server: ManagedServer, secret: str
) -> None:
    db_path = tmp_path / "tuner.db"
    db = f"sqlite:///{db_path}"
    cache = tmp_path / "cache"
    env = env_for(db, cache)

    without = run_tuner(attach_args(protected_server.url), env)
    assert without.returncode == 2
    assert without.error_lines == [
        f"error: {protected_server.url} wants an API key: pass --api-key or set TUNER_API_KEY"
    ], without.stderr

    wrong = run_tuner(attach_args(protected_server.url, "--api-key", "not-the-key"), env)
    assert wrong.returncode == 2
    assert "rejected the API key (HTTP 401)" in wrong.error_lines[0], wrong.stderr

    by_option = run_tuner(attach_args(protected_server.url, "--api-key", secret), env)
    assert by_option.returncode == 0, by_option.stderr[-3000:]
    by_env = run_tuner(attach_args(protected_server.url), {**env, "TUNER_API_KEY": secret})
    assert by_env.returncode == 0, by_env.stderr[-3000:]

    rows = peek(db, "SELECT id, status, label, spec FROM tuner_runs WHERE status = 'completed'")
    assert len(rows) == 2 and all(row[2] == "guarded" for row in rows)
    # two runs, levels 1 and 2, one counted repeat each: a round a busy machine disturbed is
    # measured again and kept apart (its samples stored too), so the counted ones are compared
    counted = peek(db, "SELECT SUM(repeats * concurrency) FROM tuner_levels")
    assert counted[0][0] == 2 * (1 + 2)
    stored = peek(db, "SELECT COUNT(*) FROM tuner_samples s WHERE s.ok = 1")
    assert stored[0][0] >= counted[0][0]
    for row in rows:
        spec = json.loads(row[3])
        assert spec["workload"]["concurrency"] == [1, 2]
        assert secret not in row[3]

    written = [p for p in tmp_path.rglob("*") if p.is_file() and "outside" not in p.parts]
    assert any(p.name.startswith("tuner.db") for p in written)
    for path in written:
        assert secret.encode() not in path.read_bytes(), f"the API key leaked into {path}"
    for result in (without, wrong, by_option, by_env):
        assert secret not in result.stdout + result.stderr
