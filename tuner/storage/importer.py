"""`tuner dev import`: a table measured elsewhere (TOML) becomes a run with source "imported".

The format (documented with a commented example in profiles/reference/README.md):

    format = 1
    model_name = "Qwen3.8-Flash-Next"     # the name `--model` uses
    model = "free text"                   # optional: quantisation, draft head, file
    host = "free text"                    # optional: the machine (becomes the run's host)
    build = "free text"                   # optional: the llama-server build
    source = "free text"                  # optional: where the numbers come from
    n_parallel = 8                        # -np of the server that was measured
    n_max = 3                             # --spec-draft-n-max of the spec rows
    concurrency = [1, 2, 4, 8]            # the levels every row's values belong to
    accept_len = 2.4                      # optional: tokens per stream per step (spec rows)
    accept_rates = [0.8, 0.5, 0.3]        # optional: per-position acceptance a_1..a_n
    weights = { "1" = 0.5, "8" = 0.5 }    # optional: share of time at each concurrency

    [[rows]]
    config = "plain"                      # plain | spec | threshold
    label = "no MTP"                      # optional: the name the source used
    tokens_per_second = [38.7, 54.0, 67.5, 78.3]   # aggregate; nan = not measured

    [[rows]]
    config = "threshold"
    max_slots = 2                         # threshold rows: --spec-draft-max-slots N
    tokens_per_second = [56.5, 58.8, 66.5, 76.9]

Rows become levels like a profile's: plain (max_slots None), spec (0), max-slots-N (N), each with
its tok/s as one repeat. Importing the same file twice returns the first run.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from sqlalchemy import select

from tuner.errors import ConfigError
from tuner.inputs import read_toml, validation_message
from tuner.policy import Policy
from tuner.storage.orm import Host, Level, Model, Run, get_or_create
from tuner.storage.store import Store

FORMAT_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ImportRow(_Strict):
    """One measured configuration across the table's concurrency levels."""

    config: Literal["plain", "spec", "threshold"]
    max_slots: int | None = Field(None, ge=1, description="threshold rows: N")
    label: str | None = None
    tokens_per_second: list[float] = Field(description="aggregate tok/s per level; nan: missing")

    @field_validator("tokens_per_second")
    @classmethod
    def _positive(cls, values: list[float]) -> list[float]:
        if any(not math.isnan(v) and v <= 0 for v in values):
            raise ValueError("tok/s must be positive (use nan for a level that was not measured)")
        return values

    @model_validator(mode="after")
    def _threshold_n(self) -> ImportRow:
        if self.config == "threshold" and self.max_slots is None:
            raise ValueError("a threshold row needs max_slots = N")
        if self.config != "threshold" and self.max_slots is not None:
            raise ValueError(f"max_slots belongs to threshold rows, not {self.config!r}")
        return self

    @property
    def policy(self) -> Policy:
        if self.config == "plain":
            return Policy.plain()
        return Policy.always() if self.config == "spec" else Policy.threshold(self.max_slots or 1)


class ImportDoc(_Strict):
    """A whole import file."""

    format: Literal[1] = FORMAT_VERSION
    model_name: str = Field(min_length=1, max_length=255)
    model: str = ""
    host: str = Field("", max_length=255)
    build: str = ""
    source: str = ""
    notes: str = ""
    n_parallel: int = Field(ge=1, le=1024)
    n_max: int = Field(ge=1, le=64)
    concurrency: list[int]
    accept_len: float | None = Field(None, ge=1.0)
    accept_rates: list[float] | None = None
    weights: dict[str, float] | None = None
    rows: list[ImportRow] = Field(min_length=1)

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, levels: list[int]) -> list[int]:
        if not levels or any(c < 1 for c in levels):
            raise ValueError("needs one or more levels, each at least 1")
        if len(set(levels)) != len(levels):
            raise ValueError("levels must not repeat")
        return levels

    @field_validator("accept_rates")
    @classmethod
    def _rates(cls, rates: list[float] | None) -> list[float] | None:
        if rates is not None and any(not 0 <= r <= 1 for r in rates):
            raise ValueError("acceptance rates are shares between 0 and 1")
        return rates

    @field_validator("weights")
    @classmethod
    def _weights(cls, weights: dict[str, float] | None) -> dict[str, float] | None:
        if weights is None:
            return None
        try:
            keys = [int(k) for k in weights]
        except ValueError:
            raise ValueError('weight keys are concurrency levels, e.g. "1" = 0.5') from None
        if any(k < 1 for k in keys) or any(w < 0 for w in weights.values()):
            raise ValueError("weights are non-negative, keyed by levels of at least 1")
        if not any(w > 0 for w in weights.values()):
            raise ValueError("at least one weight must be above zero")
        return {str(int(k)): float(v) for k, v in weights.items()}

    @model_validator(mode="after")
    def _consistent(self) -> ImportDoc:
        if max(self.concurrency) > self.n_parallel:
            raise ValueError(
                f"concurrency level {max(self.concurrency)} exceeds n_parallel ({self.n_parallel})"
            )
        seen: set[Policy] = set()
        for i, row in enumerate(self.rows):
            if len(row.tokens_per_second) != len(self.concurrency):
                raise ValueError(
                    f"rows[{i}]: {len(row.tokens_per_second)} values for "
                    f"{len(self.concurrency)} concurrency levels"
                )
            if row.policy in seen:
                raise ValueError(f"rows[{i}]: a second {row.policy.config_name!r} row")
            seen.add(row.policy)
            if row.max_slots is not None and row.max_slots > self.n_parallel:
                raise ValueError(f"rows[{i}]: max_slots exceeds n_parallel")
        return self

    def canonical_hash(self) -> str:
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, allow_nan=True)
        return hashlib.sha256(text.encode()).hexdigest()


def load_import(path: Path) -> ImportDoc:
    """Read and validate an import file; every problem is one ConfigError line naming the field."""
    data = read_toml(path, "import file")
    try:
        return ImportDoc.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(str(path), exc)) from exc


@dataclass(frozen=True)
class ImportResult:
    run_id: int
    created: bool
    model: str
    host: str | None
    levels: int


def _run_spec(doc: ImportDoc, path: Path) -> dict[str, Any]:
    """The run's stored spec: the document itself, plus weights where profiles keep them."""
    spec = doc.model_dump(mode="json")
    spec["file"] = path.name
    if doc.weights:
        spec["workload"] = {"weights": doc.weights}
    return spec


def import_table(store: Store, path: Path) -> ImportResult:
    """Store an import file as a completed run (kind "import", source "imported")."""
    doc = load_import(path)
    digest = doc.canonical_hash()
    now = dt.datetime.now(dt.UTC)
    with store.session() as session:
        existing = session.scalars(
            select(Run).where(Run.kind == "import", Run.spec_hash == digest).order_by(Run.id)
        ).first()
        if existing is not None:
            return ImportResult(
                existing.id,
                False,
                existing.model.name,
                existing.host.name if existing.host else None,
                len(existing.levels),
            )
        model = get_or_create(session, Model, {"name": doc.model_name})
        host = get_or_create(session, Host, {"name": doc.host}) if doc.host else None
        run = Run(
            kind="import",
            source="imported",
            status="completed",
            model=model,
            host=host,
            build=None,
            spec_name=path.stem,
            spec_hash=digest,
            spec=_run_spec(doc, path),
            label=doc.source or path.name,
            n_parallel=doc.n_parallel,
            n_max=doc.n_max,
            finished_at=now,
        )
        session.add(run)
        session.flush()
        count = 0
        for row in doc.rows:
            for c, tps in zip(doc.concurrency, row.tokens_per_second, strict=True):
                if math.isnan(tps):
                    continue
                repeat = {
                    "repeat": 0,
                    "concurrency": c,
                    "tokens_per_second": tps,
                    "per_stream_tps": tps / c,
                }
                if row.policy.is_always and doc.accept_len is not None:
                    repeat["accept_len"] = doc.accept_len
                session.add(
                    Level(
                        run_id=run.id,
                        config=row.policy.config_name,
                        max_slots=row.policy.max_slots,
                        n_max=doc.n_max,
                        concurrency=c,
                        status="completed",
                        repeats=1,
                        tokens_per_second=tps,
                        per_stream_tps=tps / c,
                        accept_len=1.0 if row.policy.is_plain else None,
                        metrics={"repeats": [repeat], "imported": True, "label": row.label},
                    )
                )
                count += 1
        return ImportResult(run.id, True, doc.model_name, doc.host or None, count)
