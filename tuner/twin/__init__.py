"""The twin: a simulated llama-server with known truth (issue 25).

- `world`: a TOML world (identity, server shape, acceptance, step-cost tables, noise);
  acceptance may move with the drafts verified together, the context depth and the request's
  content class;
- `engine`: the decode loop as a discrete-event model: `Engine` (incremental, for a live
  server) and `simulate` (closed levels and open loops in virtual time); `bursts`: bursty
  arrival processes (gamma gaps, a two-state MMPP) for its open-loop workloads;
- `noise`: seeded step-time noise in virtual time, presets "off", "quiet", "vm";
- `truth`: the noise-free value of every N at every concurrency, the best N per objective,
  and open-loop figures under Poisson or any other arrivals;
- `calibrate`: a world fitted to an imported table's plain and always-draft rows (import it
  from tuner.twin.calibrate: it reads tables through tuner.storage.importer); `from_run`: a world
  fitted to a stored profile run.

Those are pure (no I/O beyond world files) and are what this package exports. Built on them,
imported by their own module names:

- `inprocess`: the twin as a measurement backend of the schedule, in-process in virtual time;
- `server` (with `cmdline`, `live`, `http`, `answers`, `tokenizer`): `tuner-twin-server`, the
  twin as an HTTP llama-server taking llama-server's command line, in virtual time at
  `--speed`; `truth_table`: what `tuner dev twin truth` prints.

The twin sits below decide and imports nothing from it or from the CLI: what runs the tuner's
methods against a world, and the frozen set of worlds they are graded on, are the tests' lab
(tests/lab/).
"""

from __future__ import annotations

import importlib
from typing import Any

# Where each export lives. Loaded on first use (PEP 562), so that a process that needs only a
# light module of the package (the twin server answering `--version`, as a preflight asks it
# to, dozens of times in a test run) does not pay for numpy and the engine.
_EXPORTS = {
    "tuner.twin.engine": (
        "Emission",
        "Engine",
        "Metrics",
        "Request",
        "RequestResult",
        "SimResult",
        "SlotState",
        "SlotView",
        "StepResult",
        "TwinError",
        "Workload",
        "arrival_offsets",
        "closed_level",
        "policies",
        "request_seed",
        "simulate",
    ),
    "tuner.twin.noise": ("NoiseParams", "NoiseProcess", "NoiseSpec"),
    "tuner.twin.truth": (
        "Cell",
        "Choice",
        "ClosedTruth",
        "OpenLoopTruth",
        "closed_truth",
        "open_loop_truth",
    ),
    "tuner.twin.world": (
        "AcceptanceClass",
        "World",
        "load_world",
        "world_from_dict",
        "world_to_toml",
    ),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tuner.twin' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = sorted(_WHERE)
