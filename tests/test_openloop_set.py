"""The open-loop set of twin worlds (tests/lab/openworlds.py, profiles/twin/openloop/) and the
harness that grades methods on it (benchmarks/openloop_regret.py, tests/lab/openmethod.py).

The committed files are what the generator makes, byte for byte; every world loads and matches
its entry; the set covers what issue 45 asks of it; a traffic's workload is what its manifest
says; and the harness, on two tiny worlds of its own, grades answers against the truth: regret
zero exactly for the truth's best, the tie by the truth's resolution, a missing method skipped.
"""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
from lab import openmethod
from lab.frozen import differences
from lab.openworlds import (
    CLASSES,
    MANIFEST,
    Design,
    Entry,
    Lengths,
    Traffic,
    load_manifest,
    render_set,
    write_set,
)

from tuner.policy import Policy
from tuner.twin import load_world, world_from_dict
from tuner.twin.bursts import gap_cv

REPO = Path(__file__).resolve().parent.parent
OPENLOOP = REPO / "profiles" / "twin" / "openloop"


@pytest.fixture(scope="module")
def entries() -> list[Entry]:
    return load_manifest(OPENLOOP)


@pytest.fixture(scope="module")
def worlds(entries: list[Entry]) -> dict[str, object]:
    return {e.name: load_world(OPENLOOP / e.file) for e in entries}


def test_the_committed_set_is_what_the_generator_makes(tmp_path: Path) -> None:
    written = write_set(tmp_path)
    made = {p.name: p.read_text() for p in written}
    found = differences(made, OPENLOOP)
    assert not found, f"regenerate or revert (never adjust a world by hand): {found}"
    (tmp_path / "extra.toml").write_text("")
    (tmp_path / written[0].name).write_text("changed")
    assert differences(made, tmp_path) == [
        f"differs from the generator: {tmp_path / written[0].name}",
        f"not made by the generator: {tmp_path / 'extra.toml'}",
    ]


def test_every_world_loads_and_matches_its_entry(
    entries: list[Entry], worlds: dict[str, object]
) -> None:
    assert len(entries) >= 30
    assert len({e.name for e in entries}) == len({e.seed for e in entries}) == len(entries)
    for e in entries:
        w = worlds[e.name]
        assert w.name == e.name and w.model_name == e.model_name
        assert (w.n_parallel, w.n_max) == (e.n_parallel, e.n_max)
        assert w.prefill.draft_ms_per_token == e.draft_ms_per_token
        t = e.traffic
        assert 0.1 <= t.load <= 0.9 and t.capacity > 0
        assert t.rate == pytest.approx(t.load * t.capacity, abs=1e-6)
        assert t.prompt.high + t.output.high < w.slot_context
        for name, _ in t.classes:
            assert w.acceptance_class(name) is not None
        assert ("content-mixed" in e.tags) == bool(t.classes) == bool(w.acceptance.classes)
        assert ("accept-drafting-flat" in e.tags) == (w.acceptance.by_drafting is None)
        assert ("prompts-long" in e.tags) == (w.acceptance.by_depth is not None)


def test_the_set_covers_what_issue_45_asks(entries: list[Entry], worlds: dict[str, object]) -> None:
    tags = Counter(t for e in entries for t in e.tags)
    for family, values in (
        ("draft-prefill", ("none", "low", "mid", "high", "dominant")),
        ("accept-drafting", ("flat", "mild", "steep")),
        ("content", ("one", "mixed")),
        ("prompts", ("short", "long")),
        ("load", ("low", "mid", "high")),
        ("arrivals", ("poisson", "bursty")),
        ("surface", ("apu", "cpu", "gpu")),
    ):
        for v in values:
            assert tags[f"{family}-{v}"] >= 3, (family, v, tags)
    cost = [e.draft_ms_per_token for e in entries]
    assert min(cost) < 0.01 and max(cost) > 3.0
    loads = {e.traffic.load for e in entries}
    assert min(loads) == 0.1 and max(loads) == 0.9
    assert {e.traffic.arrivals for e in entries} == {"poisson", "gamma", "mmpp"}
    # acceptance falling with drafting slots as in llama.cpp issue 27117: to half or less by 16
    steep = [worlds[e.name] for e in entries if "accept-drafting-steep" in e.tags]
    assert all(w.drafting_factor(16) <= 0.5 and w.drafting_factor(4) >= 0.85 for w in steep)
    # two classes of different acceptance in one traffic mix
    for e in entries:
        if e.traffic.classes:
            w = worlds[e.name]
            code, prose = (w.mean_accept_len(klass=k) for k in CLASSES)
            assert code > w.mean_accept_len() > prose
            assert {k for k, _ in e.traffic.classes} == set(CLASSES)
    # issue 45's world: a draft model on the CPU at 1.2 ms a prompt token, catching up
    issue = [e for e in entries if "issue-45" in e.tags]
    assert len(issue) == 3 and len({e.traffic.load for e in issue}) == 3
    for e in issue:
        w = worlds[e.name]
        assert w.prefill.draft_ms_per_token == 1.2 and w.draft.catch_up_ms_per_token > 0
        assert max(ms for _, ms in w.draft.reeval_ms) == 0.0


def test_a_traffic_makes_the_workload_its_manifest_says(entries: list[Entry]) -> None:
    mixed = next(e for e in entries if e.traffic.classes and e.traffic.arrivals == "gamma")
    work = mixed.traffic.workload(3000, seed=11)
    assert work == mixed.traffic.workload(3000, seed=11)
    assert len(work.requests) == 3000
    span = 3000 / mixed.rate
    assert work.arrivals[0] >= 0 and work.arrivals[-1] < span
    assert gap_cv(list(work.arrivals)) > 1.5
    shares = Counter(r.content for r in work.requests)
    for name, share in mixed.traffic.classes:
        assert shares[name] / 3000 == pytest.approx(share, abs=4 * math.sqrt(0.25 / 3000))
    prompts = [r.prompt_tokens for r in work.requests]
    p = mixed.traffic.prompt
    assert p.low <= min(prompts) and max(prompts) <= p.high
    assert statistics.median(prompts) == pytest.approx(p.median, rel=0.1)
    # the truth's and the observation's requests differ; the seeds are the manifest's
    assert mixed.truth_workload() != mixed.observed_workload()
    assert len(mixed.truth_workload().requests) == mixed.truth_requests


def test_the_manifest_says_how_the_set_was_made() -> None:
    text = (OPENLOOP / MANIFEST).read_text()
    assert text.startswith("# The open-loop set of twin worlds")
    assert "BEFORE any method was graded or tuned on them" in text
    assert render_set([])[MANIFEST].splitlines()[:5] == text.splitlines()[:5]


# -- version 2 -------------------------------------------------------------------------------------

OPENLOOP2 = REPO / "profiles" / "twin" / "openloop2"


def test_version_2_is_what_its_generator_makes_and_follows_the_pinned_build(tmp_path: Path) -> None:
    from lab import openworlds2

    made = {p.name: p.read_text() for p in openworlds2.write_set(tmp_path)}
    found = differences(made, OPENLOOP2)
    assert not found, f"regenerate or revert (never adjust a world by hand): {found}"
    entries = load_manifest(OPENLOOP2)
    assert len(entries) == openworlds2.DRAWN + 3
    kinds = Counter(e.drafter for e in entries)
    assert set(kinds) == {"mtp", "draft-gpu", "draft-cpu", "ngram"} and min(kinds.values()) >= 5
    for e in entries:
        w = load_world(OPENLOOP2 / e.file)
        # every drafter one the pinned build has, charging its own kind's terms alone
        assert w.draft.kind == ("lazy" if e.drafter == "ngram" else "eager")
        if w.draft.kind == "eager":
            assert w.draft.catch_up_ms_per_token == 0.0
            assert max(ms for _, ms in w.draft.reeval_ms) > 0
        else:
            assert w.prefill.draft_ms_per_token == 0.0 and w.acceptance.by_drafting is None
        # the load is a share of the weakest compared policy's capacity (the generator's
        # capacity, checked byte for byte above): plain, always draft and N=1
        assert 0.1 <= e.traffic.load <= 0.9
        assert {p.label for p in openworlds2.compared(w)} == {"plain", "N=0", "N=1"}
    assert {e.n_parallel for e in entries if e.surface == "gpu"} == {16, 32}
    issue = [e for e in entries if openworlds2.SPECIAL in e.tags]
    assert len(issue) == 3 and all(e.drafter == "draft-cpu" for e in issue)


# -- the harness on two tiny worlds ----------------------------------------------------------------


def _benchmark() -> ModuleType:
    path = REPO / "benchmarks" / "openloop_regret.py"
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location("benchmark_openloop_regret", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiny(index: int, draft_ms: float, load: float) -> tuple[object, Entry]:
    """-np 2, n_max 2: a 10 ms step and a 2 ms draft call; the draft model's prompt cost is
    what sets plain against drafting."""
    name = f"tiny-{index}"
    world = world_from_dict(
        {
            "name": name,
            "model_name": f"twin-{name}",
            "n_parallel": 2,
            "n_max": 2,
            "acceptance": {"synth_len": 2.2},
            "step": {"rows_ms": [[1, 10.0], [6, 14.0]]},
            "draft": {"call_ms": [[1, 2.0]]},
            "prefill": {"ms_per_token": 0.1, "draft_ms_per_token": draft_ms},
            "noise": {"preset": "quiet"},
        }
    )
    traffic = Traffic(
        "poisson", 1.0, 1.0, 0.5, 1.0, load, 2.0,
        Lengths(200.0, 0.5, 8, 800), Lengths(48.0, 0.4, 8, 200), (),
    )  # fmt: skip
    entry = Entry(
        name, f"{name}.toml", world.model_name, 5 + index, 100 + index, 240, 200 + index, 60, 2, 2,
        "cpu", "none", draft_ms, "flat", "one", "short", traffic, ("surface-cpu", f"tiny-{index}"),
    )  # fmt: skip
    return world, entry


@pytest.mark.slow
def test_the_harness_grades_two_tiny_worlds_against_their_truth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = _benchmark()
    pairs = [_tiny(0, 0.0, 0.3), _tiny(1, 3.0, 0.7)]
    for name, text in render_set(pairs).items():
        (tmp_path / name).write_text(text)
    entries = load_manifest(tmp_path)
    assert [e.traffic for e in entries] == [e.traffic for _, e in pairs]
    # the open slot, filled here with "always plain" to see it wired through
    monkeypatch.setattr(openmethod, "OPEN_METHOD", lambda ctx: Policy.plain())
    out = tmp_path / "out" / "ol.json"
    rows = bench.run(tmp_path, entries, out, 1, ["closed", "naive", "open"], False)
    assert set(rows) == {"tiny-0", "tiny-1"}
    for row in rows.values():
        t = row["truth"]
        assert t["best"] == min(t["values"], key=t["values"].get)
        assert t["ties"][0] == t["best"] and t["requests"] == 240
        assert set(t["values"]) == {"plain", "N=0", "N=1"}
        for method, r in row["methods"].items():
            assert r["regret_pct"] >= 0.0, method
            assert (r["regret_pct"] == 0.0) == (r["label"] == t["best"]), method
            assert r["in_ties"] == (r["label"] in t["ties"])
        assert row["methods"]["open"]["label"] == "plain"
    # the draft model's prompt cost decides: drafting best without it, plain with 3 ms a token
    assert rows["tiny-0"]["truth"]["best"] != "plain"
    assert rows["tiny-1"]["truth"]["best"] == "plain"
    summary = bench.summary_rows(list(rows.values()), ["closed", "naive", "open"])
    assert [row[:3] for row in summary[:3]] == [["all", 2, m] for m in ("closed", "naive", "open")]
    assert summary[2][6] == 1  # "always plain" is in the tie on one world of the two
    # run again with the open-loop method itself: the truth comes from its cache, and the
    # answer drafts on the world without the draft model's prompt cost, not on the other
    monkeypatch.setattr(openmethod, "OPEN_METHOD", openmethod.open_answer)
    again = bench.run(tmp_path, entries, out, 1, ["open"], True)
    assert [r["truth"]["seconds"] for r in again.values()] == [
        rows[n]["truth"]["seconds"] for n in again
    ]
    assert again["tiny-0"]["methods"]["open"]["label"] != "plain"
    assert again["tiny-1"]["methods"]["open"]["label"] == "plain"
    text = bench.render(again, entries, ["open"])
    assert "tiny-1" in text


def test_a_design_is_one_of_the_plans_factors() -> None:
    from lab.openworlds import plan

    designs = plan()
    assert all(isinstance(d, Design) for d in designs)
    by_surface = Counter((d.surface, d.prefill) for d in designs)
    assert not any(s == "cpu" and p in ("high", "dominant") for s, p in by_surface)
