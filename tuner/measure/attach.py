"""Attach mode: measure a llama-server that is already running, as its operator configured it.

It cannot be restarted, so only its current configuration is measured, under the label given;
the API key is only ever sent as a bearer token, never stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.measure.client import LlamaClient
from tuner.measure.fingerprint import probe_host, probe_model
from tuner.measure.hold import recover_left_hold
from tuner.measure.plan import Attached, Observer, ProgressEvent, quiet
from tuner.measure.profiler import Context, Profiler
from tuner.measure.schedule import Cell, Step
from tuner.measure.spec import ProfileSpec, attached_spec
from tuner.measure.stats import stable
from tuner.storage.store import Store


def attach(
    store: Store,
    url: str,
    label: str,
    model_name: str | None,
    spec: ProfileSpec | None,
    log_dir: Path,
    observer: Observer = quiet,
    api_key: str | None = None,
    host_name: str | None = None,
    overrides: list[tuple[str, Any]] | None = None,
    state_dir: Path | None = None,
) -> int:
    """Measure one already-running server as it is configured (it cannot be restarted).

    Without a spec, overrides (`--set workload.max_tokens=32`, `--levels`) shape the workload.
    The API key is only ever sent as a bearer token: it is not part of the stored spec. With
    state_dir, a threshold a tuner that died left switched is given back first (measure/hold).
    """
    if state_dir is not None:
        recover_left_hold(url, api_key, state_dir, observer)
    with LlamaClient(url, api_key) as api:
        props = api.props()
    slots = int(props["total_slots"] or 1)
    model_path = Path(props.get("model_path") or "unknown")
    name = model_name or (spec.model_name if spec else model_path.stem)
    slot_context = (props.get("default_generation_settings") or {}).get("n_ctx")
    attached = attached_spec(
        label,
        name,
        model_path,
        slots,
        f"attached server {url} ({slots} slots)",
        spec,
        overrides,
        slot_context=int(slot_context) if slot_context else None,
    )
    context = Context(
        model_name=name,
        model=probe_model(model_path) if model_path.exists() else None,
        build=None,
        host=probe_host(None, host_name),
    )
    profiler = Profiler(store, attached, log_dir, observer, api_key=api_key)
    profiler.create_run(context, kind="profile", label=label)
    target = Attached(label)
    levels = attached.levels
    depths = profiler.depths
    total = len(depths) * len(levels) * attached.workload.max_repeats
    observer(ProgressEvent("plan", total=total))

    def body() -> None:
        profiler.attach_backend(url).warm_up(attached)
        _measure_as_it_is(profiler, target, [(d, c) for d in depths for c in levels])

    return profiler.guarded(body)


def _measure_as_it_is(profiler: Profiler, target: Attached, cells: list[Cell]) -> None:
    """The attached server measured as it is: each cell repeated until stable (one launch,
    nothing to interleave with)."""
    w = profiler.spec.workload
    recorder = profiler.recorder
    name = profiler.level_name(target)
    for cell in cells:
        if cell[0] > 0:
            profiler.prefill(target, cell[0], max(c for d, c in cells if d == cell[0]))
        reps = recorder.repeats_by_cell().get((name, *cell), [])
        before, level_id = len(reps), None
        while len(reps) < w.max_repeats and not (len(reps) >= w.min_repeats and stable(reps, w)):
            level_id = profiler.measure_step(Step(target, cell, recorder.next_pass()))  # type: ignore[arg-type]
            reps = recorder.repeats_by_cell().get((name, *cell), [])
        if level_id is not None:
            recorder.complete_level(level_id)
        left = w.max_repeats - (len(reps) - before)
        profiler.observer(
            ProgressEvent("level", advance=max(0, left), config=name, concurrency=cell[1])
        )
