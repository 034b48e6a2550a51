"""Acceptance that moves in the twin (issue 45): by the drafts verified together, by the slot's
context depth and by the request's content class; bursty arrivals; old worlds unchanged.

Small worlds defined here, noise off. Acceptance figures are checked against what the world's
tables say, within their sampling error (four standard errors), on runs long enough to make
that error small.
"""

from __future__ import annotations

import itertools
import math
import statistics
from pathlib import Path
from typing import Any

import httpx
import pytest

from tuner.errors import ConfigError
from tuner.measure.metrics import parse_metrics
from tuner.policy import Policy
from tuner.twin import Engine, Request, TwinError, Workload, World, simulate, world_from_dict
from tuner.twin.bursts import gamma_offsets, gap_cv, mmpp_offsets
from tuner.twin.cmdline import launch_world, parse_args
from tuner.twin.engine import closed_level
from tuner.twin.server import TwinServer
from tuner.twin.truth import open_loop_truth
from tuner.twin.world import load_world, world_to_toml

REPO = Path(__file__).resolve().parent.parent
FALLING = [[1, 1.0], [4, 0.9], [16, 0.3], [64, 0.3]]  # issue 27117's shape: 4 fine, 16 poor


def make_world(acceptance: dict[str, Any], n_max: int = 4, **over: Any) -> World:
    """np 8, a step of 10 ms + 0.5 ms a row, a 1 ms draft call, no noise."""
    data: dict[str, Any] = {
        "name": "acc",
        "model_name": "twin-acc",
        "n_parallel": 8,
        "n_max": n_max,
        "acceptance": acceptance,
        "step": {"rows_ms": [[1, 10.0], [65, 42.0]]},
        "draft": {"call_ms": [[1, 1.0]]},
        "noise": {"preset": "off"},
        **over,
    }
    return world_from_dict(data)


def full_drafts_at(world: World, streams: int, tokens: int = 1500) -> tuple[float, float, int]:
    """Accepted tokens per full-length draft over the steps where exactly `streams` slots
    drafted full drafts together (a closed level of always draft): mean, its standard error,
    and the count."""
    engine = Engine(world, 0, noise=False)
    for i in range(streams):
        engine.submit(Request(32, tokens, seed=1000 + i))
    accepted, drafts = [], 0
    while (step := engine.step()) is not None:
        if step.drafts_started == streams and step.draft_tokens == streams * world.n_max:
            accepted.append(step.accepted / streams)
            drafts += streams
    mean = statistics.fmean(accepted)
    # steps are means of `streams` independent drafts: their spread carries the error
    return mean, statistics.stdev(accepted) / math.sqrt(len(accepted)), drafts


def expected_accepted(world: World, factor: float, klass: str = "") -> float:
    return world.mean_accept_len(klass=klass, factor=factor) - 1.0


# -- by the drafts verified together --------------------------------------------------------------


def test_acceptance_falls_with_the_drafts_verified_together_as_the_table_says() -> None:
    world = make_world({"synth_len": 3.5, "by_drafting": FALLING})
    assert world.drafting_factor(8) == pytest.approx(0.9 - 0.6 * 4 / 12)  # 0.7
    one, one_se, n1 = full_drafts_at(world, 1, tokens=6000)
    eight, eight_se, n8 = full_drafts_at(world, 8)
    assert n1 > 1500 and n8 > 2000
    assert one == pytest.approx(expected_accepted(world, 1.0), abs=4 * one_se)
    assert eight == pytest.approx(expected_accepted(world, 0.7), abs=4 * eight_se)
    drop = expected_accepted(world, 1.0) - expected_accepted(world, 0.7)
    assert drop > 0.8  # the table's drop is far beyond the sampling error ...
    assert one - eight == pytest.approx(drop, abs=4 * math.hypot(one_se, eight_se))
    # ... and the same world without the table keeps 8 drafting slots at the one-slot figure
    flat, flat_se, _ = full_drafts_at(make_world({"synth_len": 3.5}), 8)
    assert flat == pytest.approx(expected_accepted(world, 1.0), abs=4 * flat_se)


def test_a_threshold_keeps_acceptance_up_by_drafting_fewer_slots_together() -> None:
    world = make_world({"synth_len": 3.5, "by_drafting": FALLING})
    work = Workload.closed(8, [100 + 50 * i for i in range(8)], seed=5)
    always = simulate(world, Policy.always(), work, noise=False)
    mean = sum(r.draft_accepted for r in always.requests) / sum(r.drafts for r in always.requests)
    assert mean < expected_accepted(world, 0.8)
    # N=2: while more than 2 generate nothing drafts; at the level's tail 1-2 draft together
    two = simulate(world, Policy.threshold(2), work, noise=False)
    tail = [r for r in two.requests if r.drafts]
    per = sum(r.draft_accepted for r in tail) / sum(r.drafts for r in tail)
    assert per > mean


# -- by depth -------------------------------------------------------------------------------------


def test_acceptance_falls_with_the_slots_context_depth() -> None:
    # flat at 1 below 1000 tokens, 0.5 from 2000 on: a one-token draft is accepted with p x f
    table = [[0, 1.0], [1000, 1.0], [2000, 0.5], [100000, 0.5]]
    world = make_world({"rates": [0.8], "by_depth": table}, n_max=1)
    shallow = closed_level(world, Policy.always(), 1, 3000, 32, seed=3, noise=False)
    deep = closed_level(world, Policy.always(), 1, 3000, 32, depth=2500, seed=3, noise=False)
    for result, p in ((deep, 0.4), (shallow, None)):
        log = result.requests[0].draft_log
        if p is None:  # the shallow request passes through 1000..2000 tokens: mix of factors
            early = [k for d, k in log[:300]]  # its first ~540 tokens: below 1000 of context
            share = statistics.fmean(early)
            assert share == pytest.approx(0.8, abs=4 * math.sqrt(0.16 / len(early)))
            continue
        share = statistics.fmean(k for _, k in log)
        assert share == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / len(log)))


# -- by content -----------------------------------------------------------------------------------


CLASSES = {
    "synth_len": 2.0,
    "classes": [
        {"name": "code", "marker": "```", "synth_len": 4.5},
        {"name": "prose", "share": 0.5, "rates": [0.3, 0.1, 0.03, 0.01]},
    ],
}


def test_a_requests_class_comes_from_its_marker_or_its_seed_never_the_policy() -> None:
    world = make_world(CLASSES)
    assert world.marked_class("write this ```python``` please") == "code"
    assert world.marked_class("a poem about the sea") == ""
    classes = [world.class_of(seed) for seed in range(4000)]
    assert set(classes) == {"prose", ""}
    assert classes.count("prose") / 4000 == pytest.approx(0.5, abs=4 * math.sqrt(0.25 / 4000))
    assert world.class_of(7, "code") == "code"
    with pytest.raises(TwinError, match="no acceptance class 'poetry'"):
        Engine(world, 0).submit(Request(content="poetry"))
    work = Workload.mixed([0.0] * 6, [32] * 6, [64] * 6, ["code", "", "", "", "", ""], seed=2)
    runs = [simulate(world, p, work, noise=False) for p in (Policy.always(), Policy.threshold(2))]
    assert [r.klass for r in runs[0].requests] == [r.klass for r in runs[1].requests]
    assert runs[0].requests[0].klass == "code"


def test_each_class_accepts_as_its_own_rates_say() -> None:
    world = make_world(CLASSES)
    count = 600
    contents = ["code" if i % 3 == 0 else "" for i in range(count)]
    offsets = [0.5 * i for i in range(count)]  # one at a time: no factor, full drafts
    work = Workload.mixed(offsets, [32] * count, [200] * count, contents, seed=9)
    result = simulate(world, Policy.always(), work, noise=False)
    for klass in ("code", "prose", ""):
        ks = [k for r in result.requests if r.klass == klass for d, k in r.draft_log if d == 4]
        mean = statistics.fmean(ks)
        assert mean == pytest.approx(
            expected_accepted(world, 1.0, klass), abs=4 * statistics.stdev(ks) / len(ks) ** 0.5
        )
    # the three really differ
    lengths = [world.mean_accept_len(klass=k) for k in ("code", "", "prose")]
    assert lengths == sorted(lengths, reverse=True) and lengths[0] - lengths[2] > 2.5


def test_metrics_count_every_class_position_by_position_as_llama_server(tmp_path: Path) -> None:
    """Over HTTP: a prompt holding the marker is served at its class's acceptance, and
    /metrics' per-position, draft and draft-token counters add up to what the requests got."""
    path = tmp_path / "classes.toml"
    world = make_world({**CLASSES, "by_drafting": FALLING})
    path.write_text(world_to_toml(world))
    argv = ["--model", str(path), "--port", "0", "--parallel", "4", "--noise", "off"]
    argv += ["--speed", "200", "--metrics", "--model-draft", "d", "--spec-type", "draft-simple"]
    argv += ["--spec-draft-n-max", "4"]
    served_world, policy = launch_world(parse_args(argv, env={}))
    assert served_world.acceptance.classes == world.acceptance.classes
    server = TwinServer(parse_args(argv, env={}), served_world, policy, log=lambda _: None)
    server.start_in_thread()
    try:
        answers = []
        with httpx.Client(timeout=60) as client:
            for i in range(24):
                prompt = ("```fix this```" if i % 2 else "tell a story") + f" {i}"
                body = {"prompt": prompt, "n_predict": 120, "seed": 50 + i}
                answers.append(client.post(f"{server.url}/completion", json=body).json())
            text = client.get(f"{server.url}/metrics").text
    finally:
        server.stop_thread()
    counters = parse_metrics(text)
    by_pos = counters.by_label("spec_decode_num_accepted_tokens_per_pos_total", "position")
    per_pos = [by_pos[str(i)] for i in range(4)]
    timings = [a["timings"] for a in answers]
    accepted = counters["spec_decode_num_accepted_tokens_total"]
    assert sum(per_pos) == accepted == sum(t["draft_n_accepted"] for t in timings)
    assert counters["spec_decode_num_draft_tokens_total"] == sum(t["draft_n"] for t in timings)
    # a request's 119 tokens after its first: one a step plus what its drafts accepted, every
    # step drafting but perhaps the last (a draft never overruns the request)
    steps = sum(119 - t["draft_n_accepted"] for t in timings)
    assert steps - len(timings) <= counters["spec_decode_num_drafts_total"] <= steps
    assert all(b <= a for a, b in itertools.pairwise(per_pos))
    # one at a time: the marked ones at "code"'s acceptance, far above the others
    code = [t["draft_n_accepted"] / t["draft_n"] for t in timings[1::2]]
    other = [t["draft_n_accepted"] / t["draft_n"] for t in timings[::2]]
    assert min(code) > max(other)


# -- bursty arrivals ------------------------------------------------------------------------------


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 3.0])
def test_gamma_arrivals_have_the_gaps_cv_asked_for_and_the_rate(cv: float) -> None:
    offsets = gamma_offsets(2.0, 10_000.0, cv, seed=4)
    assert len(offsets) == 20_000 and offsets == sorted(offsets)
    assert offsets[0] >= 0.0 and offsets[-1] < 10_000.0
    # the sample CV of 20 000 gamma gaps: within a few per cent of cv
    assert gap_cv(offsets) == pytest.approx(cv, rel=0.08)
    assert offsets == gamma_offsets(2.0, 10_000.0, cv, seed=4)
    assert offsets != gamma_offsets(2.0, 10_000.0, cv, seed=5)


def test_mmpp_arrivals_come_in_spells_at_the_rate_asked_for() -> None:
    offsets = mmpp_offsets(1.0, 20_000.0, seed=1, peak=8.0, busy_share=0.2, busy_s=60.0)
    assert len(offsets) == 20_000
    assert gap_cv(offsets) > 1.4
    # spells: counts per minute are overdispersed (a Poisson count's variance is its mean)
    counts = [0] * 334
    for t in offsets:
        counts[int(t // 60)] += 1
    assert statistics.variance(counts) > 5 * statistics.fmean(counts)
    work = Workload.bursty(1.0, 600.0, 64, 32, seed=2, process="mmpp", busy_s=60.0)
    assert work.arrivals == tuple(
        mmpp_offsets(1.0, 600.0, 2, peak=8.0, busy_share=0.2, busy_s=60.0)
    )
    with pytest.raises(ValueError, match="unknown arrival process"):
        Workload.bursty(1.0, 60.0, process="pareto")


# -- old worlds, the truth, the world file --------------------------------------------------------


def test_a_world_whose_factors_are_one_runs_bit_for_bit_as_one_without() -> None:
    base = load_world(REPO / "profiles" / "twin" / "bench-smollm2-cpu.toml")
    assert not base.acceptance.moves
    ones = base.with_updates(
        acceptance={"synth_len": 3.5, "by_drafting": [[1, 1.0]], "by_depth": [[0, 1.0]]}
    )
    assert ones.acceptance.moves
    work = Workload.poisson(2.0, 120.0, 96, 48, seed=3)
    for policy in (Policy.always(), Policy.threshold(3)):
        a, b = simulate(base, policy, work, seed=1), simulate(ones, policy, work, seed=1)
        assert [r.token_times for r in a.requests] == [r.token_times for r in b.requests]
        assert a.metrics == b.metrics


def test_the_open_loop_truth_pairs_policies_on_a_mixed_bursty_workload() -> None:
    world = make_world({**CLASSES, "by_drafting": FALLING})
    offsets = gamma_offsets(3.0, 400.0, 2.0, seed=1)
    n = len(offsets)
    contents = ["code" if i % 4 == 0 else "" for i in range(n)]
    work = Workload.mixed(offsets, [64 + i % 200 for i in range(n)], [100] * n, contents, seed=1)
    policies = [Policy.plain(), Policy.always(), Policy.threshold(2), Policy.threshold(8)]
    truth = open_loop_truth(world, 3.0, candidates=policies, workload=work)
    assert truth == open_loop_truth(world, 3.0, candidates=policies, workload=work)
    assert truth[Policy.threshold(8)].tpot_mean_ms == truth[Policy.always()].tpot_mean_ms
    assert truth[Policy.threshold(8)].policy == Policy.threshold(8, world.n_max)
    assert truth[Policy.plain()].accept_len != truth[Policy.plain()].accept_len  # nan: no draft
    always, two = truth[Policy.always()], truth[Policy.threshold(2)]
    # paired stretches: the arrivals' own variation, shared by both, cancels from the difference
    assert always.difference_se(two) < math.hypot(always.tpot_mean_ms_se, two.tpot_mean_ms_se)
    assert two.accept_len > always.accept_len  # fewer drafts together, better acceptance


@pytest.mark.parametrize(
    ("acceptance", "message"),
    [
        ({"synth_len": 2.0, "classes": [{"name": "a", "synth_len": 2.0}]}, "a marker, a share"),
        (
            {
                "synth_len": 2.0,
                "classes": [
                    {"name": "a", "share": 0.7, "synth_len": 2.0},
                    {"name": "b", "share": 0.7, "synth_len": 2.0},
                ],
            },
            "more than 1",
        ),
        (
            {"synth_len": 2.0, "classes": [{"name": "a", "marker": "x", "rates": [0.5]}]},
            "class 'a': rates has 1 values",
        ),
        ({"synth_len": 2.0, "by_drafting": [[1, 1.0], [1, 0.5]]}, "strictly increasing"),
        ({"synth_len": 2.0, "by_depth": [[0, -1.0]]}, "0 or more"),
    ],
)
def test_a_bad_acceptance_is_one_line_naming_its_field(
    acceptance: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        make_world(acceptance)


def test_a_world_file_with_classes_reads_back_and_old_files_write_as_before() -> None:
    world = make_world({**CLASSES, "by_drafting": FALLING, "by_depth": [[0, 1.0], [9000, 0.8]]})
    text = world_to_toml(world)
    assert "[[acceptance.classes]]" in text
    import tomllib

    assert world_from_dict(tomllib.loads(text)) == world
    old = world_to_toml(make_world({"synth_len": 2.0}))
    assert "classes" not in old and "by_drafting" not in old and "by_depth" not in old
