"""User files in, clear errors out: TOML files (profile specs, imported tables) read into dicts,
and pydantic validation errors as one line per problem, each naming its field."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tuner.errors import ConfigError


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """A TOML file as a dict; a missing, unreadable or malformed file is one ConfigError line."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"{what} not found: {path}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc


def validation_message(source: str, exc: ValidationError) -> str:
    """One line per problem, each naming the field: `source: a.b: message`."""
    return "\n".join(format_error(source, error) for error in exc.errors())


def format_error(source: str, error: dict[str, Any]) -> str:
    where = ".".join(str(part) for part in error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown key (typo?)"
    if not where:
        # Whole-spec checks name their fields in the message itself.
        return f"{source}: {message}"
    return f"{source}: {where}: {message}"
