"""`tuner dev import`: the TOML table format, its validation, and the run it becomes."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.errors import ConfigError
from tuner.policy import Policy
from tuner.storage.importer import import_table, load_import
from tuner.storage.orm import Level, Run
from tuner.storage.store import Store

REPO = Path(__file__).resolve().parent.parent
SEED = REPO / "profiles" / "reference" / "seed-qwen3.8-flash-next-gfx1151.toml"

MINIMAL = """
model_name = "m"
n_parallel = 4
n_max = 2
concurrency = [1, 2, 4]

[[rows]]
config = "plain"
tokens_per_second = [10.0, 18.0, 30.0]

[[rows]]
config = "spec"
tokens_per_second = [15.0, 20.0, nan]
"""


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'import.db'}")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "table.toml"
    path.write_text(text)
    return path


def test_seed_table_becomes_an_imported_run(store: Store) -> None:
    result = import_table(store, SEED)
    assert result.created and result.levels == 12
    assert result.model == "Qwen3.8-Flash-Next"
    with store.session() as session:
        run = session.get(Run, result.run_id)
        assert (run.kind, run.source, run.status) == ("import", "imported", "completed")
        assert (run.n_parallel, run.n_max) == (8, 3)
        assert run.host is not None and "gfx1151" in run.host.name
        levels = {(lv.config, lv.concurrency): lv for lv in run.levels}
        policies = {lv.policy for lv in run.levels}
    assert {cfg for cfg, _ in levels} == {"plain", "spec", "max-slots-2"}
    assert levels["plain", 8].max_slots is None
    assert levels["spec", 1].max_slots == 0
    assert levels["max-slots-2", 2].max_slots == 2
    # Every row reads back as the policy it was measured under, at the table's n_max.
    assert policies == {Policy.plain(), Policy.always(3), Policy.threshold(2, 3)}
    rows = {row.label: row.policy for row in load_import(SEED).rows}
    assert rows == {
        "no MTP": Policy.plain(),
        "MTP always": Policy.always(),
        "max-slots 2": Policy.threshold(2),
    }
    assert levels["max-slots-2", 2].tokens_per_second == 58.8
    assert levels["spec", 4].metrics["repeats"][0]["tokens_per_second"] == 64.8
    assert levels["spec", 4].metrics["label"] == "MTP always"


def test_importing_twice_returns_the_first_run(store: Store) -> None:
    first = import_table(store, SEED)
    second = import_table(store, SEED)
    assert not second.created and second.run_id == first.run_id
    with store.session() as session:
        assert len(session.scalars(select(Run)).all()) == 1


def test_nan_marks_a_level_that_was_not_measured(store: Store, tmp_path: Path) -> None:
    result = import_table(store, write(tmp_path, MINIMAL))
    assert result.levels == 5
    with store.session() as session:
        configs = sorted(
            (lv.config, lv.concurrency)
            for lv in session.scalars(select(Level).where(Level.run_id == result.run_id))
        )
    assert ("spec", 4) not in configs and ("plain", 4) in configs
    assert result.host is None


def test_acceptance_and_weights_are_kept(store: Store, tmp_path: Path) -> None:
    text = MINIMAL.replace(
        "concurrency = [1, 2, 4]",
        'concurrency = [1, 2, 4]\naccept_len = 2.2\nweights = { "1" = 3, "4" = 1 }',
    )
    result = import_table(store, write(tmp_path, text))
    with store.session() as session:
        run = session.get(Run, result.run_id)
        assert run.spec["workload"]["weights"] == {"1": 3.0, "4": 1.0}
        spec = next(lv for lv in run.levels if lv.config == "spec" and lv.concurrency == 1)
        assert spec.metrics["repeats"][0]["accept_len"] == 2.2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("n_max = 2", "n_max = 2\ncolour = 1"), "colour: unknown key"),
        (("[10.0, 18.0, 30.0]", "[10.0, 18.0]"), "2 values for 3 concurrency levels"),
        (('config = "spec"', 'config = "threshold"'), "needs max_slots"),
        (("n_parallel = 4", "n_parallel = 2"), "exceeds n_parallel"),
        (('config = "spec"', 'config = "plain"'), "a second 'plain' row"),
        (("[10.0, 18.0, 30.0]", "[10.0, -1.0, 30.0]"), "must be positive"),
        (("model_name", "model"), "model_name: Field required"),
    ],
)
def test_invalid_tables_name_the_field(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    path = write(tmp_path, MINIMAL.replace(*change, 1))
    with pytest.raises(ConfigError) as info:
        load_import(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_import(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_import(write(tmp_path, "rows = [["))


def test_cli_import(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    runner = CliRunner()
    result = runner.invoke(app, ["--db", db, "dev", "import", str(SEED)])
    assert result.exit_code == 0, result.output
    assert "imported" in result.stderr and "run 1" in result.stderr
    assert "56.5" in result.stdout and "78.3" in result.stdout
    again = runner.invoke(app, ["--db", db, "dev", "import", str(SEED)])
    assert again.exit_code == 0 and "already imported" in again.stderr
    bad = runner.invoke(app, ["--db", db, "dev", "import", str(tmp_path / "missing.toml")])
    assert bad.exit_code == 2 and "not found" in bad.stderr


def test_the_documented_example_is_a_valid_table(store: Store, tmp_path: Path) -> None:
    readme = (REPO / "profiles" / "reference" / "README.md").read_text()
    example = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    doc = load_import(write(tmp_path, example))
    assert doc.accept_rates == [0.8, 0.45, 0.2] and doc.weights is not None
    result = import_table(store, write(tmp_path, example))
    assert result.levels == 11  # 12 values, one nan
