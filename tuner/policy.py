"""The policy: how llama-server drafts across its slots, as one value everywhere.

A policy is plain (no drafting), always draft (`--spec-draft-max-slots 0`, the server's default:
no limit) or threshold N (no new drafts while more than N slots generate), at a draft length
n_max (`--spec-draft-n-max`; None where it is the profiled one or does not apply). Storage keys
levels by it, the cost model predicts it, the search chooses one, validation measures several
and the report draws them. Its text forms live here and nowhere else:

- `label` for people: `plain`, `N=0` (always draft), `N=3`;
- `config_name` for stored levels and server logs: `plain`, `spec`, `max-slots-3`;
- `parse` reads either back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

PLAIN = "plain"
ALWAYS = "spec"  # the stored name of always-draft levels
THRESHOLD_PREFIX = "max-slots-"


@dataclass(frozen=True)
class Policy:
    """plain (max_slots None), always draft (0) or threshold N (N >= 1), at draft length n_max."""

    max_slots: int | None
    n_max: int | None = None

    def __post_init__(self) -> None:
        if self.max_slots is not None and self.max_slots < 0:
            raise ValueError(f"max_slots must be 0 or more, not {self.max_slots}")
        if self.n_max is not None and self.n_max < 1:
            raise ValueError(f"n_max must be 1 or more, not {self.n_max}")

    @classmethod
    def plain(cls) -> Policy:
        return cls(None)

    @classmethod
    def always(cls, n_max: int | None = None) -> Policy:
        return cls(0, n_max)

    @classmethod
    def threshold(cls, n: int, n_max: int | None = None) -> Policy:
        if n < 1:
            raise ValueError(f"a threshold is 1 or more, not {n}")
        return cls(n, n_max)

    @classmethod
    def of_max_slots(cls, max_slots: int | None, n_max: int | None = None) -> Policy:
        """From the value of --spec-draft-max-slots (None: the server does not draft)."""
        return cls(max_slots, n_max if max_slots is not None else None)

    # -- what it does --

    @property
    def drafting(self) -> bool:
        return self.max_slots is not None

    @property
    def is_plain(self) -> bool:
        return self.max_slots is None

    @property
    def is_always(self) -> bool:
        return self.max_slots == 0

    @property
    def is_threshold(self) -> bool:
        return bool(self.max_slots)

    def drafts_at(self, streams: Any) -> Any:
        """Whether new drafts start while `streams` slots generate; elementwise for an array of
        levels (the cost model's mask), the one rule the profiler, schedule and model share."""
        if self.max_slots is None:
            return False
        return self.max_slots == 0 or streams <= self.max_slots

    def effective(self, n_parallel: int) -> int:
        """The largest number of streams it drafts at: 0 for plain, n_parallel for always."""
        if self.max_slots is None:
            return 0
        return n_parallel if self.max_slots == 0 else min(self.max_slots, n_parallel)

    def with_n_max(self, n_max: int | None) -> Policy:
        return replace(self, n_max=n_max if self.drafting else None)

    def describe(self, n_parallel: int) -> str:
        """In words, for legends and summaries."""
        if self.max_slots is None:
            return "no drafting"
        if self.max_slots == 0:
            return "always draft"
        if self.max_slots >= n_parallel:
            return f"draft at every level up to {n_parallel}"
        return f"draft while <= {self.max_slots} streams"

    # -- text forms --

    @property
    def label(self) -> str:
        """plain, N=0 (always draft), N=k."""
        return PLAIN if self.max_slots is None else f"N={self.max_slots}"

    @property
    def config_name(self) -> str:
        """The name stored levels and server logs use: plain, spec, max-slots-k."""
        if self.max_slots is None:
            return PLAIN
        return ALWAYS if self.max_slots == 0 else f"{THRESHOLD_PREFIX}{self.max_slots}"

    def __str__(self) -> str:
        return self.label

    @property
    def sort_key(self) -> tuple[int, int]:
        """plain first, then by N (always draft as N=0)."""
        return (0, 0) if self.max_slots is None else (1, self.max_slots)

    @classmethod
    def parse(cls, text: str, n_max: int | None = None) -> Policy:
        """Read a label or a config name back: plain, spec/always, N=k, max-slots-k."""
        value = text.strip().lower()
        if value == PLAIN:
            return cls.plain()
        if value in (ALWAYS, "always", "n=0", THRESHOLD_PREFIX + "0"):
            return cls.always(n_max)
        match = re.fullmatch(rf"(?:n=|{THRESHOLD_PREFIX})(\d+)", value)
        if match is None:
            raise ValueError(
                f"{text!r} is not a policy: expected plain, spec, N=k or {THRESHOLD_PREFIX}k"
            )
        return cls.threshold(int(match.group(1)), n_max)

    @classmethod
    def from_stored(cls, config: str, max_slots: int | None, n_max: int | None) -> Policy | None:
        """The policy of a stored level, or None for one that names no policy (an attached
        server measured as its operator configured it)."""
        try:
            policy = cls.parse(config, n_max)
        except ValueError:
            return None
        return policy if policy.max_slots == max_slots else None


def stored_policy(config: str) -> Policy | None:
    """The policy of a stored level's config name (plain, spec, max-slots-k[@nK]); None for an
    attached server's label."""
    base = config.split("@", 1)[0]
    try:
        return Policy.parse(base)
    except ValueError:
        return None


def drafts_at(config: str, concurrency: int) -> bool | None:
    """Whether a stored level's config drafts at this concurrency (plain never does); None for
    an attached server's label."""
    policy = stored_policy(config)
    return policy.drafts_at(concurrency) if policy is not None else None
