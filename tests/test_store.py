"""Storage: migrations create the tuner_ tables, SQLite runs in WAL, sessions roll back cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect, select, text

from tuner.errors import ConfigError, StorageError
from tuner.storage.orm import Model, Run, get_or_create
from tuner.storage.store import HEAD_REVISION, VERSION_TABLE, Store, alembic_config, migrate


def test_migrations_create_prefixed_tables_and_own_version_table(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    tables = set(inspect(store.engine).get_table_names())
    assert VERSION_TABLE in tables
    assert "alembic_version" not in tables  # that name is Optuna's
    assert {"tuner_runs", "tuner_levels", "tuner_samples", "tuner_fits"} <= tables
    assert all(t.startswith("tuner_") for t in tables)
    Store(f"sqlite:///{tmp_path / 'a.db'}")  # a second open is an upgrade to head: a no-op


def test_the_known_head_is_the_migrations_own_and_an_older_database_is_upgraded(
    tmp_path: Path,
) -> None:
    """Store opens a database at HEAD_REVISION without alembic; one at an older revision must
    still be upgraded, and HEAD_REVISION must follow every new migration."""
    from alembic import command
    from alembic.script import ScriptDirectory

    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    head = ScriptDirectory.from_config(alembic_config(store.engine)).get_current_head()
    assert head == HEAD_REVISION
    with store.engine.begin() as connection:
        assert connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all() == [
            (head,)
        ]
    command.downgrade(alembic_config(store.engine), "-1")
    migrate(store.engine)
    with store.engine.begin() as connection:
        assert connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all() == [
            (head,)
        ]


def test_sqlite_uses_wal_and_a_busy_timeout(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    with store.engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA busy_timeout")).scalar() >= 1000


def test_session_rolls_back_and_raises_a_storage_error(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    with store.session() as session:
        session.add(Model(name="m"))
    with pytest.raises(StorageError), store.session() as session:
        session.add(Model(name="kept-out"))
        session.add(Model(name="m"))  # duplicate name: the whole transaction is rolled back
        session.flush()
    with store.session() as session:
        assert session.scalars(select(Model.name)).all() == ["m"]


def test_get_or_create_is_idempotent_and_fills_missing_facts(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    with store.session() as session:
        first = get_or_create(session, Model, {"name": "m"})
    with store.session() as session:
        again = get_or_create(session, Model, {"name": "m"}, {"file_sha256": "ab" * 32})
        assert again.id == first.id
        assert again.file_sha256 == "ab" * 32


def test_run_spec_round_trips_as_json(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    with store.session() as session:
        model = get_or_create(session, Model, {"name": "m"})
        session.add(Run(kind="profile", model=model, spec={"workload": {"weights": {"1": 0.5}}}))
    with store.session() as session:
        assert session.scalars(select(Run)).one().spec["workload"]["weights"] == {"1": 0.5}


@pytest.mark.parametrize("url", ["nosuchdb://x/y", "://not-a-url"])
def test_bad_database_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError, match="database URL"):
        Store(url)


def test_the_orm_models_and_the_migrations_agree(tmp_path: Path) -> None:
    """What `alembic check` does: the schema the migrations build has nothing the ORM lacks or
    differs in, so a model change without its migration fails here."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from tuner.storage.orm import Base

    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    with store.engine.connect() as connection:
        context = MigrationContext.configure(
            connection,
            opts={
                "version_table": VERSION_TABLE,
                "compare_type": True,
                "include_object": lambda obj, name, type_, reflected, compare_to: (
                    type_ != "table" or name.startswith("tuner_")
                ),
            },
        )
        differences = compare_metadata(context, Base.metadata)
    assert differences == []
