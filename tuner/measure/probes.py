"""The profile's arrival probes: what a request costs the slots already generating, beyond what
closed levels show (tuner.model.arrivals fits them).

- Catch-up: on the drafting server at threshold 1, two requests start together: a short one of
  k + 1 tokens and a long one. While both generate (2 > 1) neither drafts; when the short one
  ends the long one drafts again, k tokens behind. Its resume step's excess over its next
  drafting steps (from its per-token times and draft counter) is the catch-up of k tokens;
  rounds at several k give the cost a token.
- Join: one long request alone on plain and on the always-drafting server, short requests (one
  output token) arriving while it generates; the long request's step that evaluates a join's
  prompt (it ends when the join's first token comes) against its other steps is what a join
  costs the running slots.

Both are open-loop rounds through the backend (`Backend.arrivals`), so the twin runs them in
virtual time as llama-server runs them in real time. The pure parts turn a round's samples into
records; `probe_arrivals` runs the rounds and stores them (tuner.storage.probes).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

from tuner.measure.backend import Backend
from tuner.measure.load import RequestSample, Workload
from tuner.model.arrivals import ProbeRecord
from tuner.policy import Policy
from tuner.storage import probes as stored
from tuner.storage.store import Store

CATCH_UP_BEHIND = (8, 24, 48)  # tokens the long request generates without drafting
REFERENCE_STEPS = 8  # drafting steps after the resume its excess is taken against
JOIN_LONG = 96  # the running request's output tokens in a join round
JOINS = 3  # joins per round
ROUND_KEY = 900_000  # probe rounds' keys: apart from every schedule's pass x 1000 + pair


def _steps(sample: RequestSample) -> list[tuple[float, int]]:
    """(time, draft counter) of each step that gave the request tokens, in order."""
    out: list[tuple[float, int]] = []
    drafts = sample.token_drafts or [0] * len(sample.token_times)
    for t, d in zip(sample.token_times, drafts, strict=False):
        if out and t == out[-1][0]:
            out[-1] = (t, d)
        else:
            out.append((t, d))
    return out


def catch_up_excess(long: RequestSample) -> tuple[int, float] | None:
    """(tokens behind, ms the resume step took beyond the next drafting steps) of the long
    request of a catch-up round; None where it never drafted after a stretch without."""
    steps = _steps(long)
    resume = next((i for i, (_, d) in enumerate(steps) if d > 0), None)
    if resume is None or resume < 2 or resume + 2 >= len(steps):
        return None
    # tokens it had before the resume, less the first (from its prompt): generated undrafted
    behind = sum(1 for t in long.token_times if t < steps[resume][0]) - 1
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(steps)]
    after = gaps[resume : resume + REFERENCE_STEPS]
    if len(after) < 2:
        return None
    return behind, 1000.0 * (gaps[resume - 1] - statistics.median(after))


def join_excesses(long: RequestSample, joins: Sequence[RequestSample]) -> list[tuple[int, float]]:
    """(the join's prompt tokens, ms the running request's step took beyond its median) for
    every join whose prompt step the running request shared: the running step ending nearest
    the join's first token, within half a usual step (a client's clock sees both a little
    apart; the twin's, at once)."""
    steps = _steps(long)
    ends = [b[0] for _, b in itertools.pairwise(steps)]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(steps)]
    if len(gaps) < 4:
        return []
    usual_all = statistics.median(gaps)
    at: dict[int, RequestSample] = {}
    for j in joins:
        if j.ok and j.token_times:
            i = min(range(len(ends)), key=lambda k: abs(ends[k] - j.token_times[0]))
            if abs(ends[i] - j.token_times[0]) < 0.5 * usual_all:
                at[i] = j
    others = [g for i, g in enumerate(gaps) if i not in at]
    if len(others) < 3:
        return []
    usual = statistics.median(others)
    return [(j.prompt_tokens, 1000.0 * (gaps[i] - usual)) for i, j in sorted(at.items())]


def catch_up_rounds(
    backend: Backend, workload: Workload, n_max: int, repeats: int
) -> list[ProbeRecord]:
    """The catch-up probe's rounds on the drafting server at threshold 1: every distance
    behind, repeats times."""
    policy = Policy.threshold(1, n_max)
    records: list[ProbeRecord] = []
    key = ROUND_KEY
    for _ in range(repeats):
        for behind in CATCH_UP_BEHIND:
            key += 1
            lengths = [behind + 1, behind + 8 * (n_max + 1) + 8]
            measured = backend.arrivals(policy, [0.0, 0.0], key, lengths, workload)
            got = catch_up_excess(measured.samples[1]) if measured.samples[1].ok else None
            if got is not None:
                records.append(ProbeRecord("catch-up", True, float(got[0]), got[1]))
    return records


def join_rounds(
    backend: Backend, workload: Workload, n_max: int, repeats: int
) -> list[ProbeRecord]:
    """The join probe's rounds on plain and on the always-drafting server, repeats a policy
    (after one alone, which times where the joins arrive)."""
    records: list[ProbeRecord] = []
    key = ROUND_KEY + 500
    for policy in (Policy.plain(), Policy.always(n_max)):
        key += 1
        alone = backend.arrivals(policy, [0.0], key, [JOIN_LONG], workload).samples[0]
        if not alone.ok or len(alone.token_times) < 2:
            continue
        first = alone.token_times[0] - alone.start
        span = alone.token_times[-1] - alone.token_times[0]
        offsets = [0.0] + [first + span * (i + 1) / (JOINS + 1) for i in range(JOINS)]
        for _ in range(repeats):
            key += 1
            lengths = [JOIN_LONG] + [1] * JOINS
            samples = backend.arrivals(policy, offsets, key, lengths, workload).samples
            for tokens, excess in join_excesses(samples[0], samples[1:]):
                records.append(ProbeRecord("join", policy.drafting, float(tokens), excess))
    return records


def probe_arrivals(
    store: Store,
    run_id: int,
    backend: Backend,
    workload: Workload,
    n_max: int,
    catch_up: bool,
    repeats: int,
) -> str:
    """Run the probes on the backend (repeats rounds of each shape) and store them with the
    run; a line that says what was measured (nothing where the run has its probes already)."""
    if stored.has_probes(store, run_id):
        return "arrival probes: stored already"
    joins = join_rounds(backend, workload, n_max, repeats)
    stored.save_probe(store, run_id, "join", joins, concurrency=1, n_max=n_max)
    said = f"arrival probes: {len(joins)} joins"
    if catch_up:
        resumes = catch_up_rounds(backend, workload, n_max, repeats)
        stored.save_probe(store, run_id, "catch-up", resumes, concurrency=2, n_max=n_max)
        said += f", {len(resumes)} resumes after a stretch without drafting"
    else:
        said += "; catch-up not probed (it needs a threshold: the live switch or the twin)"
    return said
