"""The tuner's tables as SQLAlchemy 2.0 typed ORM models, prefixed `tuner_`.

Optuna keeps its own tables in the same database, hence the prefix. The schema is created and
upgraded only by the Alembic migrations in `db/` (shipped as tuner/storage/migrations);
`Base.metadata` is what those migrations are checked against (tests/test_store.py).
"""

from __future__ import annotations

import datetime as dt
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
    select,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from tuner.policy import Policy

# Status of a run or a level.
RUNNING, COMPLETED, FAILED, INTERRUPTED = "running", "completed", "failed", "interrupted"


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
    # How the run switched between policies: "relaunch" (a launch per policy), "live" (drafting
    # policies switched on one launch through POST /props), "twin" (the simulated server).
    way: Mapped[str | None] = mapped_column(String(16))

    model: Mapped[Model] = relationship()
    host: Mapped[Host | None] = relationship()
    build: Mapped[Build | None] = relationship()
    levels: Mapped[list[Level]] = relationship(back_populates="run", order_by="Level.id")


class Level(Base):
    """One configuration at one concurrency within a run: medians over repeats, with spreads."""

    __tablename__ = "tuner_levels"
    __table_args__ = (
        UniqueConstraint(
            "run_id",
            "config",
            "concurrency",
            "context_tokens",
            name="uq_tuner_levels_run_config_concurrency_depth",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("tuner_runs.id", ondelete="CASCADE"), index=True)
    config: Mapped[str] = mapped_column(String(64))  # Policy.config_name, or an attach label
    max_slots: Mapped[int | None]  # None: plain (no drafting); 0: always draft; N: threshold
    n_max: Mapped[int | None]
    concurrency: Mapped[int]
    # tokens each stream held when it started decoding (its prompt, padded); 0: the prompt alone
    context_tokens: Mapped[int] = mapped_column(default=0, server_default="0")
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

    @property
    def policy(self) -> Policy | None:
        """The policy this level measured; None for an attached server measured as configured."""
        return Policy.from_stored(self.config, self.max_slots, self.n_max)


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
    # decode (n_seq x 1) | verify (n_seq x (n+1)) | draft (the draft model's n_seq x 1)
    shape: Mapped[str] = mapped_column(String(16))
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


class RecommendationRow(Base):
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


class OpenLoopResult(Base):
    """One configuration under one Poisson arrival rate in an open-loop validation run."""

    __tablename__ = "tuner_openloop"
    __table_args__ = (UniqueConstraint("run_id", "config", "rate"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("tuner_runs.id", ondelete="CASCADE"), index=True)
    config: Mapped[str] = mapped_column(String(64))
    max_slots: Mapped[int | None]
    rate: Mapped[float] = mapped_column(Float)
    figures: Mapped[dict[str, Any]] = mapped_column(default=dict)  # OpenLoopFigures.to_dict()
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Traffic(Base):
    """A running server's traffic as `tuner observe` learnt it: seconds at each number of
    generating slots, and request lengths. One row per name; observing again adds to it."""

    __tablename__ = "tuner_traffic"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    server: Mapped[str] = mapped_column(String(255))  # host:port of the URL (no credentials)
    model: Mapped[str] = mapped_column(String(255))
    source: Mapped[str] = mapped_column(String(16))  # slots | metrics
    n_slots: Mapped[int]
    status: Mapped[str] = mapped_column(String(32))  # observing | complete
    profile: Mapped[dict[str, Any]] = mapped_column(default=dict)  # TrafficProfile.to_dict()
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


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
