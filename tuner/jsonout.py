"""JSON as the tuner writes it, for programs and databases alike: NaN and infinities as null
(PostgreSQL's JSON rejects them, and a program reading `--format json` should never meet a
bare NaN), numpy scalars as Python numbers, one line."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """A JSON-able copy with NaN and infinities as None."""
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        value = value.tolist()  # a numpy scalar or array (numpy not imported here: base layer)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def json_line(data: Any) -> str:
    """data as one line of strict JSON (anything else as its str)."""
    return json.dumps(finite(data), default=str, allow_nan=False)
