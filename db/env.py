"""Alembic environment for the tuner's own tables (Optuna's live beside them, untouched)."""

from alembic import context

from tuner.store import VERSION_TABLE, Base

config = context.config
target_metadata = Base.metadata


def include_object(obj, name, type_, reflected, compare_to):
    # Only our tables: Optuna's tables share the database and are migrated by Optuna.
    if type_ == "table":
        return name.startswith("tuner_")
    return True


def run_migrations_online() -> None:
    engine = config.attributes["engine"]
    with engine.begin() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            version_table=VERSION_TABLE,
            include_object=include_object,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        context.run_migrations()


run_migrations_online()
