"""Settings in one place: env prefix TUNER_, database URL, cache, state and bench locations."""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

APP_NAME = "tuner"


def default_db_url() -> str:
    data_dir = Path(platformdirs.user_data_dir(APP_NAME))
    return f"sqlite:///{data_dir / 'tuner.db'}"


class Settings(BaseSettings):
    """Every knob the tuner reads from the environment (TUNER_*)."""

    model_config = SettingsConfigDict(env_prefix="TUNER_", extra="ignore")

    db: str = Field(default_factory=default_db_url, description="SQLAlchemy database URL")
    cache_dir: Path = Field(
        default_factory=lambda: Path(platformdirs.user_cache_dir(APP_NAME)),
        description="where bench builds, bench models and server logs live",
    )
    state_dir: Path = Field(
        default_factory=lambda: Path(platformdirs.user_data_dir(APP_NAME)) / "state",
        description="what a running tuner leaves for the next: locks and records of the "
        "servers it holds (a tune of a server it did not start)",
    )
    bench_manifest: Path | None = Field(
        default=None,
        description="bench.toml written by `tuner bench setup` (default: in cache_dir)",
    )
    api_key: str | None = Field(default=None, description="bearer token for attach mode")
    host_name: str | None = Field(
        default=None, description="override the host name results go under"
    )
    db_busy_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="how long a write waits for another process's lock (SQLite busy timeout)",
    )

    @property
    def bench_manifest_path(self) -> Path:
        return self.bench_manifest or self.cache_dir / "bench" / "bench.toml"

    @property
    def log_dir(self) -> Path:
        return self.cache_dir / "logs"


def get_settings() -> Settings:
    """Read the settings afresh, so a changed environment (tests, --db) takes effect.

    A bad value is one ConfigError line naming its environment variable.
    """
    from tuner.errors import ConfigError

    try:
        return Settings()
    except ValidationError as exc:
        problems = [
            f"TUNER_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}" for e in exc.errors()
        ]
        raise ConfigError("; ".join(problems)) from exc
