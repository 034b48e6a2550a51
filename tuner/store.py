"""Storage: ORM models (tables prefixed `tuner_`), engine set-up, migrations, a session helper.

Optuna keeps its own tables in the same database, so every table here is prefixed `tuner_` and
Alembic's version table is `tuner_alembic_version`. The schema is created and upgraded only by the
migrations in `db/`; `Base.metadata` is what those migrations are checked against.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    make_url,
    select,
    text,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    relationship,
    sessionmaker,
)

from tuner.errors import ConfigError, StorageError

# db/ of the source tree, shipped in the package as tuner/migrations (see pyproject.toml).
MIGRATIONS_DIR = Path(str(resources.files("tuner").joinpath("migrations")))
VERSION_TABLE = "tuner_alembic_version"
SQLITE_BUSY_TIMEOUT_MS = 30_000  # the default; TUNER_DB_BUSY_TIMEOUT_S overrides it


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar = {dict[str, Any]: JSON, list[Any]: JSON}


class Host(Base):
    """A machine measurements were taken on."""

    __tablename__ = "tuner_hosts"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    cpu_model: Mapped[str | None] = mapped_column(String(255))
    cpu_cores: Mapped[int | None]
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    devices: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Build(Base):
    """A llama-server binary, fingerprinted by sha256 (the version line alone is not unique)."""

    __tablename__ = "tuner_builds"

    id: Mapped[int] = mapped_column(primary_key=True)
    binary_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    version_text: Mapped[str] = mapped_column(Text, default="")
    has_max_slots: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Model(Base):
    """A model as users name it; file facts are filled in when the GGUF is at hand."""

    __tablename__ = "tuner_models"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    file_size: Mapped[int | None] = mapped_column(BigInteger)
    file_sha256: Mapped[str | None] = mapped_column(String(64))
    content_id: Mapped[str | None] = mapped_column(String(64))  # fingerprint.content_id
    architecture: Mapped[str | None] = mapped_column(String(64))
    quantization: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Run(Base):
    """One profile, import, validation or sweep, with the spec exactly as it ran."""

    __tablename__ = "tuner_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))  # profile | import | validate | sweep
    source: Mapped[str] = mapped_column(String(32), default="measured")  # measured | imported
    status: Mapped[str] = mapped_column(String(32), default="running")
    model_id: Mapped[int] = mapped_column(ForeignKey("tuner_models.id"))
    host_id: Mapped[int | None] = mapped_column(ForeignKey("tuner_hosts.id"))
    build_id: Mapped[int | None] = mapped_column(ForeignKey("tuner_builds.id"))
    spec_name: Mapped[str] = mapped_column(String(255), default="")
    spec_hash: Mapped[str] = mapped_column(String(64), default="", index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    label: Mapped[str | None] = mapped_column(String(255))
    n_parallel: Mapped[int | None]
    n_max: Mapped[int | None]
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    # A validation run: the recommendation it checked and the N it measured as that one.
    recommendation_id: Mapped[int | None] = mapped_column(
        ForeignKey("tuner_recommendations.id", name="fk_tuner_runs_recommendation_id")
    )
    validated_max_slots: Mapped[int | None]

    model: Mapped[Model] = relationship()
    host: Mapped[Host | None] = relationship()
    build: Mapped[Build | None] = relationship()
    levels: Mapped[list[Level]] = relationship(back_populates="run", order_by="Level.id")


class Level(Base):
    """One configuration at one concurrency within a run: medians over repeats, with spreads."""

    __tablename__ = "tuner_levels"
    __table_args__ = (UniqueConstraint("run_id", "config", "concurrency"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("tuner_runs.id", ondelete="CASCADE"), index=True)
    config: Mapped[str] = mapped_column(String(64))  # plain | spec | max-slots-N
    max_slots: Mapped[int | None]  # None: plain (no drafting); 0: always draft; N: threshold
    n_max: Mapped[int | None]
    concurrency: Mapped[int]
    status: Mapped[str] = mapped_column(String(32), default="running")  # running|completed|failed
    repeats: Mapped[int] = mapped_column(default=0)
    tokens_per_second: Mapped[float | None] = mapped_column(Float)
    tokens_per_second_spread: Mapped[float | None] = mapped_column(Float)
    per_stream_tps: Mapped[float | None] = mapped_column(Float)
    step_ms: Mapped[float | None] = mapped_column(Float)
    step_ms_spread: Mapped[float | None] = mapped_column(Float)
    accept_len: Mapped[float | None] = mapped_column(Float)  # tokens per stream per step, E[L]
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)  # /metrics deltas, per repeat
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    run: Mapped[Run] = relationship(back_populates="levels")
    samples: Mapped[list[Sample]] = relationship(back_populates="level", order_by="Sample.id")


class Sample(Base):
    """One request as the load generator saw it (failed ones too)."""

    __tablename__ = "tuner_samples"
    __table_args__ = (UniqueConstraint("level_id", "repeat", "stream"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    level_id: Mapped[int] = mapped_column(
        ForeignKey("tuner_levels.id", ondelete="CASCADE"), index=True
    )
    repeat: Mapped[int]
    stream: Mapped[int]
    ok: Mapped[bool] = mapped_column(Boolean)
    error: Mapped[str | None] = mapped_column(Text)
    tokens: Mapped[int] = mapped_column(default=0)
    prompt_tokens: Mapped[int] = mapped_column(default=0)
    generation_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    draft_n: Mapped[int] = mapped_column(default=0)
    draft_accepted: Mapped[int] = mapped_column(default=0)
    steps: Mapped[int | None]

    level: Mapped[Level] = relationship(back_populates="samples")


class KernelRow(Base):
    """One llama-batched-bench measurement: a batch of n_seq sequences x tokens_per_seq rows."""

    __tablename__ = "tuner_kernel_rows"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("tuner_runs.id", ondelete="CASCADE"), index=True)
    shape: Mapped[str] = mapped_column(String(16))  # decode (n_seq x 1) | verify (n_seq x (n+1))
    n_seq: Mapped[int]
    tokens_per_seq: Mapped[int]
    rows: Mapped[int]
    step_ms: Mapped[float] = mapped_column(Float)


class Fit(Base):
    """A fitted cost model, with its inputs and version, so recommendations can cite it."""

    __tablename__ = "tuner_fits"

    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("tuner_models.id"))
    host_id: Mapped[int | None] = mapped_column(ForeignKey("tuner_hosts.id"))
    build_id: Mapped[int | None] = mapped_column(ForeignKey("tuner_builds.id"))
    version: Mapped[str] = mapped_column(String(32))
    form: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    inputs: Mapped[dict[str, Any]] = mapped_column(default=dict)
    quality: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    model: Mapped[Model] = relationship()
    host: Mapped[Host | None] = relationship()
    build: Mapped[Build | None] = relationship()


class Recommendation(Base):
    """A chosen N (and n_max), with the fit and Optuna study it came from."""

    __tablename__ = "tuner_recommendations"

    id: Mapped[int] = mapped_column(primary_key=True)
    fit_id: Mapped[int] = mapped_column(ForeignKey("tuner_fits.id"))
    study_name: Mapped[str] = mapped_column(String(255))
    max_slots: Mapped[int]
    n_max: Mapped[int | None]
    objective: Mapped[float] = mapped_column(Float)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    fit: Mapped[Fit] = relationship()


class FileHash(Base):
    """A file's full sha256 as computed on a host, valid while its size and mtime_ns stand.

    Keyed by host too: machines sharing one database may hold different files at one path.
    """

    __tablename__ = "tuner_file_hashes"
    __table_args__ = (UniqueConstraint("host", "path"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    path: Mapped[str] = mapped_column(String(4096))  # absolute, symlinks resolved
    size: Mapped[int] = mapped_column(BigInteger)
    mtime_ns: Mapped[int] = mapped_column(BigInteger)
    content_id: Mapped[str] = mapped_column(String(64))
    sha256: Mapped[str] = mapped_column(String(64))
    hashed_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


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


def default_busy_timeout_s() -> float:
    """TUNER_DB_BUSY_TIMEOUT_S, else 30 s: how long a write waits for another process's lock."""
    from tuner.settings import get_settings

    return get_settings().db_busy_timeout_s


def display_url(url: str) -> str:
    """The URL with any password masked, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def make_engine(url: str, busy_timeout_s: float | None = None) -> Engine:
    """An engine for any SQLAlchemy URL; SQLite files get WAL, a busy timeout and their folder."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(
            f"database URL (--db / TUNER_DB) {url!r} is not a valid SQLAlchemy URL "
            f"(use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB)"
        ) from exc
    kwargs: dict[str, Any] = {}
    timeout_s = default_busy_timeout_s() if busy_timeout_s is None else busy_timeout_s
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
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
        timeout_s = default_busy_timeout_s() if busy_timeout_s is None else busy_timeout_s
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


def at_head(engine: Engine) -> bool:
    """Whether the schema is already at the newest migration (a plain read: takes no lock)."""
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
    from alembic import command

    url = engine.url.render_as_string(hide_password=False)
    try:
        if at_head(engine):
            return
        command.upgrade(alembic_config(engine), "head")
    except SQLAlchemyError as exc:
        raise storage_error(exc, url, "cannot migrate the database") from exc


class Store:
    """The database: an engine, migrated on first use, and a session helper."""

    def __init__(
        self, url: str, migrate_schema: bool = True, busy_timeout_s: float | None = None
    ) -> None:
        self.url = url
        self.busy_timeout_s = default_busy_timeout_s() if busy_timeout_s is None else busy_timeout_s
        self.engine = make_engine(url, self.busy_timeout_s)
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

    def file_hashes(self, host: str | None = None) -> StoredHashes:
        """This database's cache of full file hashes for host (default: this machine's name)."""
        return StoredHashes(self, host)

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
        timeout_s = default_busy_timeout_s() if busy_timeout_s is None else busy_timeout_s
        kwargs["connect_args"] = {"timeout": timeout_s}
    try:
        with schema_lock(url):
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except SQLAlchemyError as exc:
        raise storage_error(exc, url, "cannot open Optuna's tables") from exc


T = TypeVar("T", bound=Base)


def get_or_create(
    session: Session, model: type[T], lookup: dict[str, Any], values: dict[str, Any] | None = None
) -> T:
    """The row matching lookup, created with values if missing; safe against a concurrent insert."""
    row = session.scalars(select(model).filter_by(**lookup)).first()
    if row is not None:
        for key, value in (values or {}).items():
            if value is not None and getattr(row, key) is None:
                setattr(row, key, value)  # fill facts learnt later (e.g. a model's sha256)
        return row
    try:
        with session.begin_nested():
            row = model(**lookup, **(values or {}))
            session.add(row)
    except IntegrityError:
        # Another process inserted the same row between our select and insert.
        row = session.scalars(select(model).filter_by(**lookup)).one()
    return row


class StoredHashes:
    """Full file hashes kept in tuner_file_hashes for one host: a fingerprint.FileHashCache."""

    def __init__(self, store: Store, host: str | None = None) -> None:
        self.store = store
        self.host = host or socket.gethostname()

    def get(self, path: Path, size: int, mtime_ns: int, content_id: str) -> str | None:
        query = select(FileHash).filter_by(host=self.host, path=str(path))
        with self.store.session() as session:
            row = session.scalars(query).first()
        if row is None or (row.size, row.mtime_ns, row.content_id) != (size, mtime_ns, content_id):
            return None
        return row.sha256

    def put(self, path: Path, size: int, mtime_ns: int, content_id: str, sha256: str) -> None:
        facts = {"size": size, "mtime_ns": mtime_ns, "content_id": content_id, "sha256": sha256}
        with self.store.session() as session:
            row = get_or_create(session, FileHash, {"host": self.host, "path": str(path)}, facts)
            # get_or_create only fills empty columns; an existing row is stale: overwrite it.
            for key, value in {**facts, "hashed_at": utcnow()}.items():
                setattr(row, key, value)
