"""Alembic environment for the tuner's own tables (Optuna's live beside them, untouched)."""

from alembic import context

from tuner.storage.orm import Base
from tuner.storage.store import VERSION_TABLE

config = context.config
target_metadata = Base.metadata


def include_object(obj, name, type_, reflected, compare_to):
    # Only our tables: Optuna's tables share the database and are migrated by Optuna.
    if type_ == "table":
        return name.startswith("tuner_")
    return True


# Any constant: the key of the PostgreSQL advisory lock that serialises migrations.
MIGRATION_LOCK_KEY = 0x74756E6572


def _lock_for_migration(connection) -> None:
    """One migrating process at a time: two tuner processes of a fleet may start together."""
    if connection.dialect.name == "sqlite":
        # Take the write lock before alembic reads the version table (waits the busy timeout).
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    elif connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")


def run_migrations_online() -> None:
    engine = config.attributes["engine"]
    with engine.begin() as connection:
        _lock_for_migration(connection)
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            version_table=VERSION_TABLE,
            include_object=include_object,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        context.run_migrations()


run_migrations_online()
