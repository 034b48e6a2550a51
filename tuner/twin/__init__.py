"""The twin: a simulated llama-server with known truth (issue 25).

- `world`: a TOML world (identity, server shape, acceptance, step-cost tables, noise);
- `engine`: the decode loop as a discrete-event model: `Engine` (incremental, for a live
  server) and `simulate` (closed levels and open loops in virtual time);
- `noise`: seeded step-time noise in virtual time, presets "off", "quiet", "vm";
- `truth`: the noise-free value of every N at every concurrency, the best N per objective,
  and open-loop figures under Poisson arrivals;
- `calibrate`: a world fitted to an imported table's plain and always-draft rows (import it
  from tuner.twin.calibrate: it reads tables through tuner.storage.importer); `from_run`: a world
  fitted to a stored profile run.

Those are pure (no I/O beyond world files) and are what this package exports. Built on them,
imported by their own module names:

- `backend`: the twin as a measurement backend of the schedule, in-process in virtual time;
  `method`: the tuner's methods run against a world (what `benchmarks/twin_regret.py` grades);
- `server` (with `launch`, `live`, `http`, `answers`, `tokenizer`): `tuner-twin-server`, the
  twin as an HTTP llama-server taking llama-server's command line, in virtual time at
  `--speed`; `summary`: what `tuner twin truth` prints;
- `frozen`: the frozen set of worlds the method is graded on.
"""

from tuner.twin.engine import (
    Emission,
    Engine,
    Metrics,
    Request,
    RequestResult,
    SimResult,
    SlotState,
    SlotView,
    StepResult,
    TwinError,
    Workload,
    closed_level,
    policies,
    request_seed,
    simulate,
)
from tuner.twin.noise import NoiseParams, NoiseProcess, NoiseSpec
from tuner.twin.truth import (
    Cell,
    Choice,
    ClosedTruth,
    OpenLoopTruth,
    closed_truth,
    open_loop_truth,
)
from tuner.twin.world import World, load_world, world_from_dict, world_to_toml

__all__ = [
    "Cell",
    "Choice",
    "ClosedTruth",
    "Emission",
    "Engine",
    "Metrics",
    "NoiseParams",
    "NoiseProcess",
    "NoiseSpec",
    "OpenLoopTruth",
    "Request",
    "RequestResult",
    "SimResult",
    "SlotState",
    "SlotView",
    "StepResult",
    "TwinError",
    "Workload",
    "World",
    "closed_level",
    "closed_truth",
    "load_world",
    "open_loop_truth",
    "policies",
    "request_seed",
    "simulate",
    "world_from_dict",
    "world_to_toml",
]
