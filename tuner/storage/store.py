"""The database: engine set-up for any SQLAlchemy URL, migrations, the session helper that turns
database errors into StorageError, and the cross-process locks a fleet sharing one database needs.

Alembic's version table is `tuner_alembic_version` (Optuna's is `alembic_version`, beside it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, make_url, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from tuner.errors import ConfigError, StorageError

# db/ of the source tree, shipped in the package as tuner/storage/migrations (pyproject.toml).
MIGRATIONS_DIR = Path(str(resources.files("tuner.storage").joinpath("migrations")))
VERSION_TABLE = "tuner_alembic_version"
# The newest migration's revision: a database already at it is known by one read, without
# importing alembic (a quarter of a second of every command's start-up). tests/test_store.py
# holds it to the migrations' own head, so a new migration cannot leave it behind.
HEAD_REVISION = "0007"
DEFAULT_BUSY_TIMEOUT_S = 30.0  # how long a write waits for another process's lock (settings)

# --- engine, migrations, sessions ------------------------------------------------------------


def _sqlite_pragmas(busy_timeout_ms: int) -> Callable[[Any, Any], None]:
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # WAL lets readers and one writer work at once; the busy timeout makes a second tuner
        # process wait for a lock instead of failing at once.
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        _enter_wal(cursor, busy_timeout_ms / 1000)
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return on_connect


def _enter_wal(cursor: Any, timeout_s: float) -> None:
    """Switch a SQLite database to WAL. On a new file that several processes open at once the
    switch fails with "database is locked" at once, whatever the busy timeout: retry it."""
    import sqlite3

    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def display_url(url: str) -> str:
    """The URL with any password masked, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def database_url(name: str) -> str:
    """A database as the user named it (--db / TUNER_DB): an SQLAlchemy URL as given, or a plain
    file path (`~/tuner.db`, `./runs.db`), which names an SQLite file."""
    if "://" in name or name.startswith("sqlite:"):
        return name
    return f"sqlite:///{Path(name).expanduser().absolute()}"


def make_engine(url: str, busy_timeout_s: float | None = None) -> Engine:
    """An engine for any SQLAlchemy URL or SQLite file path (database_url); SQLite files get WAL,
    a busy timeout and their folder."""
    url = database_url(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise ConfigError(
            f"database URL (--db / TUNER_DB) {url!r} is not a valid SQLAlchemy URL "
            f"(use a file path, sqlite:///PATH or postgresql+psycopg://USER@HOST/DB)"
        ) from exc
    kwargs: dict[str, Any] = {}
    timeout_s = DEFAULT_BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            folder = Path(parsed.database).expanduser().parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                why = "a file is there" if isinstance(exc, FileExistsError) else exc.strerror
                raise StorageError(
                    f"cannot make the folder {folder} of the SQLite database "
                    f"{display_url(url)} (--db / TUNER_DB): {why or exc}"
                ) from exc
        kwargs["connect_args"] = {"timeout": timeout_s}
    try:
        engine = create_engine(parsed, **kwargs)
    except NoSuchModuleError as exc:
        raise ConfigError(
            f"database URL (--db / TUNER_DB) {parsed.render_as_string(hide_password=True)!r}: "
            f"unknown dialect {parsed.drivername!r} "
            f"(use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB)"
        ) from exc
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"database URL {parsed.render_as_string(hide_password=True)!r} needs the Python "
            f"package {exc.name!r}; install it (e.g. pip install 'tuner[postgres]')"
        ) from exc
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas(round(timeout_s * 1000)))
    return engine


_LOCKED = ("database is locked", "database table is locked", "lock timeout", "locknotavailable")
_FULL = ("database or disk is full", "no space left on device", "disk full", "diskfull")
_IO = ("disk i/o error", "file too large")
_CONNECT = ("connection refused", "could not connect", "connection failed", "unable to open")


def storage_error(
    exc: SQLAlchemyError,
    url: str,
    doing: str = "database error",
    busy_timeout_s: float | None = None,
) -> StorageError:
    """A StorageError that says what went wrong in words: locked, disk full, unreachable."""
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0] if str(exc) else ""
    low = f"{exc.__class__.__name__} {getattr(exc, 'orig', '')!r} {exc}".lower()
    where = display_url(url)
    if any(word in low for word in _LOCKED):
        timeout_s = DEFAULT_BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
        return StorageError(
            f"database {where} is locked: another process held a write lock for longer than the "
            f"busy timeout (TUNER_DB_BUSY_TIMEOUT_S, {timeout_s:g} s) ({detail})"
        )
    if any(word in low for word in _FULL):
        return StorageError(
            f"cannot write to database {where}: the disk is full; free space, then run again "
            f"({detail})"
        )
    if any(word in low for word in _IO):
        return StorageError(
            f"cannot write to database {where}: disk I/O error (disk full or file size limit?) "
            f"({detail})"
        )
    if any(word in low for word in _CONNECT):
        return StorageError(f"cannot open database {where}: {detail}")
    return StorageError(f"{doing}: {exc.__class__.__name__}: {detail}")


def alembic_config(engine: Engine):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("version_table", VERSION_TABLE)
    config.attributes["engine"] = engine
    return config


def stored_revision(engine: Engine) -> str | None:
    """The revision the database's version table holds (None: no table, or not one row)."""
    try:
        with engine.connect() as connection:
            rows = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    except SQLAlchemyError:
        return None
    return str(rows[0][0]) if len(rows) == 1 else None


def at_head(engine: Engine) -> bool:
    """Whether the schema is already at the newest migration (a plain read: takes no lock)."""
    if stored_revision(engine) == HEAD_REVISION:
        return True
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision() == head


def migrate(engine: Engine) -> None:
    """Create or upgrade the tuner's tables to the newest migration.

    Several processes may start at once on one database (a fleet): the migration itself runs
    under a database-wide lock (db/env.py), so only one of them creates the tables.
    """
    url = engine.url.render_as_string(hide_password=False)
    try:
        if at_head(engine):
            return
        from alembic import command

        command.upgrade(alembic_config(engine), "head")
    except SQLAlchemyError as exc:
        raise storage_error(exc, url, "cannot migrate the database") from exc


class Store:
    """The database: an engine, migrated on first use, and a session helper."""

    def __init__(
        self, url: str, migrate_schema: bool = True, busy_timeout_s: float | None = None
    ) -> None:
        self.url = database_url(url)
        self.busy_timeout_s = DEFAULT_BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
        self.engine = make_engine(self.url, self.busy_timeout_s)
        if migrate_schema:
            migrate(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """Commit on success, roll back on failure; database errors become StorageError."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except SQLAlchemyError as exc:
            with contextlib.suppress(SQLAlchemyError):
                session.rollback()
            raise storage_error(exc, self.url, busy_timeout_s=self.busy_timeout_s) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    @contextlib.contextmanager
    def exclusive(self, key: str) -> Iterator[Session]:
        """A session holding a database-wide lock named key until it commits or rolls back.

        For check-then-insert work that must happen once across a fleet (e.g. "fit this data
        unless an equal fit exists"): only one process at a time gets past the lock, and it sees
        what the previous holder committed. SQLite takes its write lock (BEGIN IMMEDIATE, waiting
        the busy timeout); PostgreSQL an advisory transaction lock on a hash of key; other
        databases get a plain session.
        """
        with self.session() as session:
            dialect = self.engine.dialect.name
            if dialect == "sqlite":
                session.execute(text("BEGIN IMMEDIATE"))
            elif dialect == "postgresql":
                digest = hashlib.sha256(key.encode()).digest()
                lock_id = int.from_bytes(digest[:8], "big", signed=True)
                session.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": lock_id})
            yield session

    def dispose(self) -> None:
        self.engine.dispose()


OPTUNA_LOCK_KEY = 0x6F7074756E61  # the advisory lock that serialises Optuna's schema creation


@contextlib.contextmanager
def schema_lock(url: str) -> Iterator[None]:
    """Hold a lock across processes while creating tables outside our migrations (Optuna's).

    PostgreSQL: a session advisory lock on its own connection. SQLite: flock on the database's
    folder (never on the database file: closing another descriptor of it would drop SQLite's own
    POSIX locks). Anything else: no lock.
    """
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        engine = create_engine(parsed)
        try:
            with engine.connect() as connection:
                connection.exec_driver_sql(f"SELECT pg_advisory_lock({OPTUNA_LOCK_KEY})")
                try:
                    yield
                finally:
                    connection.exec_driver_sql(f"SELECT pg_advisory_unlock({OPTUNA_LOCK_KEY})")
                    connection.commit()
        finally:
            engine.dispose()
    elif backend == "sqlite" and parsed.database and parsed.database != ":memory:":
        import fcntl

        folder = Path(parsed.database).expanduser().resolve().parent
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock
    else:
        yield


def optuna_storage(url: str, busy_timeout_s: float | None = None) -> Any:
    """Optuna's RDBStorage on the tuner's database, safe when a fleet starts at once.

    Optuna creates its tables on first use; two processes doing that together collide (on
    PostgreSQL: a unique violation on CREATE TYPE studydirection). The creation runs under
    schema_lock, and SQLite connections get the tuner's busy timeout.
    """
    import optuna

    kwargs: dict[str, Any] = {}
    if make_url(url).get_backend_name() == "sqlite":
        timeout_s = DEFAULT_BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
        kwargs["connect_args"] = {"timeout": timeout_s}
    try:
        with schema_lock(url):
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except SQLAlchemyError as exc:
        raise storage_error(exc, url, "cannot open Optuna's tables") from exc
