"""`tuner profile` against the real bench: what it stores and what `show` and `runs` print.

Resume after every kind of fault (the tuner killed outright among them) is tests/test_faults.py's;
which N the measurements favour is the twin's (tests/test_bench_twin.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import SHARED_PROFILE_LEVELS, SHARED_PROFILE_TOKENS, ProfiledBench
from sqlalchemy import select
from tunerproc import tuner_cmd, tuner_env

from tuner.storage.orm import Build, Host, KernelRow, Level, Model, Run, Sample
from tuner.storage.store import Store

pytestmark = pytest.mark.bench


def _levels(store: Store, run_id: int) -> dict[tuple[str, int], Level]:
    with store.session() as session:
        return {
            (lv.config, lv.concurrency): lv
            for lv in session.scalars(select(Level).filter_by(run_id=run_id))
        }


def test_bench_profile_stores_everything(bench_profile: ProfiledBench) -> None:
    """What one `tuner profile` of the patched bench stores: every request of every repeat with
    its server-side timings, both configurations measured in the same interleaved passes, the
    threshold that does not draft at 4 streams measured on always-draft's launch (the live
    switch), acceptance per position from /metrics, the model, build, host and kernel rows.

    Whether drafting pays where (the bench's contrast) is a speed figure this shared machine
    can flip: tests/test_bench_twin.py holds it on the bench's twin; here it is only printed."""
    store = Store(bench_profile.db_url)
    levels = _levels(store, bench_profile.run_id)
    output = bench_profile.output
    assert "adaptive levels: off (--budget 0)" in output  # the shared profile's --budget 0
    assert "live switch:" in output, output[-3000:]
    base = set(SHARED_PROFILE_LEVELS)
    # always-draft and its off arm (threshold c-1: no draft at c) on one launch, above 1 stream
    off_arms = {(f"max-slots-{c - 1}", c) for c in base if c > 1}
    # the arrival probes: joins on plain and always-draft; catch-up needs the live switch
    probes = {("probe:join", 1), ("probe:catch-up", 2)}
    assert probes <= set(levels), sorted(levels)
    levels = {k: v for k, v in levels.items() if k not in probes}
    assert set(levels) == {(cfg, c) for cfg in ("plain", "spec") for c in base} | off_arms
    with store.session() as session:
        run = session.get(Run, bench_profile.run_id)
        assert run.status == "completed"
        assert run.spec["speculative"]["n_max"] == 6
        for level in levels.values():
            assert level.status == "completed"
            assert level.repeats == 2  # min_repeats = max_repeats = 2
            stored = session.scalars(select(Sample).filter_by(level_id=level.id)).all()
            # every request of every repeat is stored, with its server-side timings; a round a
            # busy machine disturbed was measured again, its samples stored too and set apart,
            # so the counted repeats' are what adds up (how busy the machine was is no part of it)
            counted = {r["repeat"] for r in level.metrics["repeats"]}
            samples = [s for s in stored if s.repeat in counted]
            assert len(samples) == level.repeats * level.concurrency
            assert all(s.ok and s.tokens == SHARED_PROFILE_TOKENS and s.steps for s in stored)
            assert level.step_ms and level.step_ms_spread is not None
        # Interleaved: every repeat is tagged with its pass, and every configuration of a
        # level was measured in the same passes (paired neighbours), one pass after another.
        for c in base:
            passes = {
                cfg: sorted(r["pass"] for r in lv.metrics["repeats"])
                for (cfg, at), lv in levels.items()
                if at == c
            }
            assert all(p == [0, 1] for p in passes.values()), (c, passes)
        # The configuration that ends a pass starts the next on the same launch (plain, spec
        # spec, plain): passes + 1 launches that measure, and no fewer.
        logs = list((bench_profile.log_dir / f"run-{run.id}").glob("*.log"))
        launches = [p for p in logs if p.name.startswith(("plain", "drafting"))]
        assert len(launches) >= 2 + 1, launches
        # Drafting, read from the draft counters: always-draft drafted in every request, plain
        # in none. The off arm's requests may draft before the last stream joins and after the
        # first finishes (how much depends on how far apart they started: one full run saw 78
        # tokens where 48 had been allowed), so it is checked inside the window only, below.
        drafted = {
            key: [s.draft_n for s in session.scalars(select(Sample).filter_by(level_id=lv.id))]
            for key, lv in levels.items()
        }
        for (cfg, c), counts in drafted.items():
            if cfg == "spec":
                assert all(n > 0 for n in counts), (cfg, c, counts)
            elif cfg == "plain":
                assert sum(counts) == 0, (cfg, c, counts)
        # Inside the measured window (every stream generating) the off arm started no draft:
        # what its rounds counted there is at most one draft in flight a stream, never marked
        # drafted_off; always-draft drafted there.
        windows = {
            key: [(r["window_drafted"], r.get("drafted_off")) for r in lv.metrics["repeats"]]
            for key, lv in levels.items()
        }
        print(f"drafts inside the window, per round: {windows}")
        for (cfg, c), rounds in windows.items():
            if cfg.startswith("max-slots-"):
                assert all(d is not None and d <= 6 * c and off is None for d, off in rounds)
            elif cfg == "spec":
                assert all(d is not None and d > 0 for d, _ in rounds), (cfg, c, rounds)
        model = session.scalars(select(Model)).one()
        assert (model.name, model.architecture, model.quantization) == (
            "smollm2-135m-f32",
            "llama",
            "ALL_F32",
        )
        assert len(model.file_sha256) == 64 and model.file_size > 500e6
        build = session.scalars(select(Build)).one()
        assert build.has_max_slots and len(build.binary_sha256) == 64
        assert session.scalars(select(Host)).one().cpu_cores == os.cpu_count()
        kernel = session.scalars(select(KernelRow).filter_by(run_id=run.id)).all()
        assert {k.shape for k in kernel} == {"decode", "verify", "draft"}
        assert max(k.rows for k in kernel) == 8 * 7  # -np x (n_max + 1)
        # full drafts' verify batches measured again alone (prompt_repeats: 1 here)
        full = sorted(k.n_seq for k in kernel if k.shape == "verify" and k.tokens_per_seq == 7)
        assert full == sorted(2 * list(range(1, 9))), full
        decode = sorted(k.n_seq for k in kernel if k.shape == "decode")  # 3 lengths, and again
        assert decode == sorted(4 * list(range(1, 9))), decode
        # the draft model's generation steps at 1..-np sequences (--model-draft bench:draft)
        draft = sorted(k.n_seq for k in kernel if k.shape == "draft")
        assert draft == list(range(1, 9)), draft
    # Acceptance is measured per position from /metrics: E[L] = 1 + sum a_i, near synth-len
    # 3.5 (at 4 streams: the level with the most drafts, about 150).
    rates = levels[("spec", 4)].metrics["accept_rates"]
    assert len(rates) == 6 and 2.5 < 1 + sum(rates) < 4.5, rates
    contrast = {
        c: round(levels[("spec", c)].tokens_per_second / levels[("plain", c)].tokens_per_second, 3)
        for c in sorted(base)
    }
    print(f"spec / plain tok/s by streams (not asserted): {contrast}; {_machine_state()}")


def _machine_state() -> str:
    """Load average and the five busiest processes: what else held the CPUs."""
    ps = subprocess.run(
        ["ps", "-eo", "pid,pcpu,etimes,args", "--sort=-pcpu"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    busy = [line.strip()[:120] for line in ps[1:6]]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"load average {load}; busiest processes: {busy}"


def test_show_and_runs_print_the_measured_table(
    bench_profile: ProfiledBench, tmp_path: Path
) -> None:
    env = tuner_env(bench_profile.db_url, tmp_path)
    shown = subprocess.run(
        tuner_cmd("show", str(bench_profile.run_id)),
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    store = Store(bench_profile.db_url)
    plain_4 = _levels(store, bench_profile.run_id)[("plain", 4)].tokens_per_second
    assert "plain" in shown and "spec" in shown
    assert f"{plain_4:.1f}" in shown
    listed = subprocess.run(
        tuner_cmd("runs"), env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "smollm2-135m-f32" in listed and "completed" in listed
    missing = subprocess.run(tuner_cmd("show", "999"), env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and "run 999 does not exist" in missing.stderr
