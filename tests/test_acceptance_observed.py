"""Acceptance from production: the server's own acceptance counters read by `tuner observe` (and
`tuner watch`) over a window, their estimate and interval (tuner.model.acceptance), and `recommend
--traffic` putting them in place of the profile's acceptance (tuner.decide.observed).

The counters' reading and its bad input (a restart mid-window, a server without per-position
counters, one without draft counters, requests waiting for a slot, a window with no drafting)
are scripted against the poller; the estimate's interval is checked on the twin in-process; and
on the twin over HTTP, observe under Poisson load recovers the acceptance of a world whose
acceptance is 30 % above the profile's, and recommend then finds the truth's N where the
profile's acceptance alone does not. The same against the real bench is in
tests/test_acceptance_bench.py."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_observe import Scripted
from twinworlds import world

from tuner.decide.observed import acceptance_line, observed_in_place
from tuner.decide.settle import TOLERANCE
from tuner.measure import observe as observe_module
from tuner.measure.metrics import parse_metrics
from tuner.measure.observe import Poller
from tuner.measure.readings import RESTARTED, CounterReading, counter_reading, counter_step
from tuner.model.acceptance import MIN_DRAFTS, ObservedAcceptance, observed_acceptance
from tuner.policy import Policy
from tuner.recommendation import ReasonCode
from tuner.traffic import AcceptanceCounts, TrafficProfile
from tuner.twin.production import ServedTraffic, arrivals


def scrape(
    drafts: float,
    accepted_by_position: list[float] | None,
    tokens: float = 0.0,
    deferred: float = 0.0,
    counters: bool = True,
) -> str:
    """A /metrics text as llama-server's: draft counters (unless counters is False) and the
    per-position family where given."""
    lines = [f"llamacpp:tokens_predicted_total {tokens}", f"llamacpp:requests_deferred {deferred}"]
    if counters:
        accepted = sum(accepted_by_position or [])
        lines += [
            f"llamacpp:spec_decode_num_drafts_total {drafts}",
            f"llamacpp:spec_decode_num_draft_tokens_total {3 * drafts}",
            f"llamacpp:spec_decode_num_accepted_tokens_total {accepted}",
        ]
        name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
        for i, n in enumerate(accepted_by_position or []):
            lines.append(f'{name}{{position="{i}"}} {n}')
    return "\n".join(lines) + "\n"


def test_a_reading_gives_the_counters_and_a_step_their_increase() -> None:
    first = counter_reading(parse_metrics(scrape(100, [80, 50], tokens=1000)))
    assert first == CounterReading(100, 300, 130, (80, 50), 1000, 0)
    # positions appear as the server drafts further: a position first seen counts from 0
    later = counter_reading(parse_metrics(scrape(150, [120, 75, 10], tokens=1600, deferred=2)))
    assert later is not None and later.deferred == 2
    assert counter_step(first, later) == (50, 150, 75, [40, 25, 10], 600)
    # a counter that went down: the server restarted between the readings
    restarted = counter_reading(parse_metrics(scrape(20, [15, 9], tokens=200)))
    assert counter_step(later, restarted) == RESTARTED
    # without the per-position family: the totals only
    stock = counter_reading(parse_metrics(scrape(100, None, tokens=1000)))
    assert stock is not None and stock.positions is None
    # without draft counters at all: nothing to read
    assert counter_reading(parse_metrics(scrape(0, None, counters=False))) is None


def test_counts_add_merge_and_round_trip() -> None:
    a = AcceptanceCounts()
    a.add(10, 30, 12, [8, 4])
    a.add(20, 60, 30, [18, 9, 3])  # a third position appears
    assert (a.drafts, a.accepted, a.positions, a.readings) == (30, 42, [26, 13, 3], 2)
    again = AcceptanceCounts.from_dict(json.loads(json.dumps(a.to_dict())))
    assert again == a
    b = AcceptanceCounts()
    b.add(5, 15, 5, None)  # a server without per-position counts
    both = a.plus(b)
    assert not both.per_position and both.positions == [] and both.accepted == 47
    assert both.drafts == 35 and both.readings == 3
    # a profile carries them through its own round trip and sum
    profile = TrafficProfile(4, acceptance=a)
    assert TrafficProfile.from_dict(profile.to_dict()).acceptance == a
    assert profile.plus(profile).acceptance.drafts == 60


def estimand(w, rate: float) -> float:
    """What the counters converge to on a world's traffic (the same output lengths: the last
    drafts of a request are cut short, in the profile as here): a long noise-free run."""
    served = ServedTraffic(w, arrivals("poisson", rate, 999, 21_000), 0, seed=999, noise=False)
    seen = TrafficProfile(w.n_parallel)
    served.window(20_000, seen)
    observed = observed_acceptance(seen.acceptance)
    assert observed is not None
    return observed.mean_length


def test_the_interval_of_observed_acceptance_covers_what_it_estimates() -> None:
    """Thirty windows of five minutes of Poisson traffic on the twin, each read as observe
    reads it: the 90 % interval holds the long-run value in most of them (here 27-28 of 30; a
    binomial count of drafts, blind to requests' own differences, would claim more)."""
    w = world("zigzag-quiet")
    target = estimand(w, 0.3)
    covered, widths = 0, []
    for seed in range(30):
        served = ServedTraffic(w, arrivals("poisson", 0.3, seed), 0, seed=seed)
        seen = TrafficProfile(w.n_parallel)
        served.window(300.0, seen)
        observed = observed_acceptance(seen.acceptance)
        assert observed is not None and observed.rates is not None
        lo, hi = observed.interval()
        covered += lo <= target <= hi
        widths.append(hi - lo)
        assert observed.enough() is None, observed.enough()
    assert 24 <= covered <= 30, covered
    assert max(widths) < 0.1 * target  # and it is narrow enough to use


def test_too_little_or_no_drafting_keeps_the_profiles_acceptance() -> None:
    few = AcceptanceCounts()
    for _ in range(12):
        few.add(20, 60, 30, [18, 9, 3])
    observed = observed_acceptance(few)
    assert observed is not None and f"fewer than {MIN_DRAFTS}" in (observed.enough() or "")
    nothing = AcceptanceCounts()
    for _ in range(12):
        nothing.add(0, 0, 0, [0, 0, 0], tokens=500)
    assert observed_acceptance(nothing) is None
    line = acceptance_line(TrafficProfile(4, acceptance=nothing))
    assert "no draft was made in 12 readings" in line and "more slots generating than N" in line
    # one reading: a mean, and no interval (printed as such, never as [-inf, inf])
    once = AcceptanceCounts()
    once.add(46, 138, 0, [0, 0, 0])
    line = acceptance_line(TrafficProfile(4, acceptance=once))
    assert "no interval from 46 drafts in one reading" in line, line
    assert "inf" not in line and "nan" not in line, line


class Full(Scripted):
    """The scripted client, its /metrics answering whole texts."""

    def metrics(self):
        return parse_metrics(str(self._next("metrics")))


def polled(monkeypatch: pytest.MonkeyPatch, texts: list[str]) -> tuple[TrafficProfile, list[str]]:
    """A poller over a scripted server: at every poll a request ends in slot 0 and another
    takes it, so observe reads /metrics (the next of texts) to settle its output; the profile
    after one poll per text, and what the poller said."""

    def ending(task: int) -> list[tuple[str, object]]:
        return [("slots", [{"id": 0, "id_task": task, "is_processing": True,
                            "next_token": [{"n_decoded": 1}], "n_prompt_tokens": 9}])]  # fmt: skip

    states: list[tuple[str, object]] = [("slots", []), ("metrics", scrape(0, None))]
    for task, text in enumerate(texts, start=1):
        states += [*ending(task), ("metrics", text), *ending(task)]
    client = Full(states)
    monkeypatch.setattr(observe_module, "_client", lambda url, key: client)
    said: list[str] = []
    poller = Poller(
        "http://scripted", lambda e: said.append(e.text), sleep=lambda s: None, wall=lambda: 0.0
    )
    profile = TrafficProfile(2)
    for _ in texts:
        poller.step(profile)
    return profile, said


def test_the_poller_reads_acceptance_and_says_what_it_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Readings come at polls where a request ended (observe's settling of outputs): their
    increments are kept, the interval across a restart is not, and a server without
    per-position counters, or with requests waiting for a slot, is said once."""
    profile, said = polled(
        monkeypatch,
        [
            scrape(0, [0, 0], tokens=0),
            scrape(40, [30, 20], tokens=300),
            scrape(90, [70, 40], tokens=700, deferred=1),
            scrape(10, [8, 5], tokens=60),  # restarted: counters from 0 again
            scrape(50, [38, 25], tokens=400),
        ],
    )
    counts = profile.acceptance
    # kept: 0 -> 40 -> 90, then 10 -> 50; the 90 -> 10 interval is dropped
    assert counts.drafts == 130 and counts.positions == [100, 60] and counts.readings == 3
    assert counts.dropped == 1 and profile.deferred == 1 and profile.readings == 5
    assert sum("went down" in s for s in said) == 1
    assert sum("waited for a free slot" in s for s in said) == 1

    stock, said = polled(monkeypatch, [scrape(0, None), scrape(40, None), scrape(90, None)])
    assert not stock.acceptance.per_position and stock.acceptance.drafts == 90
    assert sum("not accepted tokens per draft position" in s for s in said) == 1

    plain, said = polled(monkeypatch, [scrape(0, None, counters=False)] * 2)
    assert plain.acceptance.readings == 0
    assert sum("has no draft counters" in s for s in said) == 1


def test_observed_acceptance_replaces_the_profiles_with_its_spread(tmp_path: Path) -> None:
    """The cost model with the observed rates: spec tok/s scales with the tokens a drafting
    step yields, at every level, the step times untouched; the replicates carry the observed
    estimate's spread (a wide one widens the interval of the prediction)."""
    from lab.method import HOST, twin_spec

    from tuner.decide.adaptive import profile_adaptively
    from tuner.storage.fits import current_fit
    from tuner.storage.store import Store
    from tuner.twin.inprocess import TwinBackend

    w = world("zigzag-quiet")
    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    profile_adaptively(
        store, twin_spec(w), tmp_path, host_name=HOST,
        backend=TwinBackend(w, switch="live"), switch="live", budget_s=0.0,
    )  # fmt: skip
    cm = current_fit(store, w.model_name, HOST).model
    store.dispose()
    own = cm.acceptance.rates
    assert own is not None

    def counts(scale: float, readings: int, spread: float) -> AcceptanceCounts:
        rng = np.random.default_rng(1)
        out = AcceptanceCounts()
        for _ in range(readings):
            d = 200.0
            pos = [d * r * scale * (1 + spread * rng.standard_normal()) for r in own]
            out.add(d, 3 * d, sum(pos), pos)
        return out

    higher = TrafficProfile(cm.n_parallel, acceptance=counts(1.2, 40, 0.01))
    model, reason, seen = observed_in_place(cm, higher, "prod")
    assert reason.code is ReasonCode.OBSERVED_ACCEPTANCE and "in place of" in reason.text
    assert seen is not None and len(seen["acceptance"]) == cm.n_max
    ratio = model.acceptance.length() / cm.acceptance.length()
    expected = (1 + 1.2 * sum(own)) / (1 + sum(own))
    assert ratio == pytest.approx(expected, rel=5e-3)
    for c in (1, 3, cm.n_parallel):
        assert model.spec_tps([c])[0] / cm.spec_tps([c])[0] == pytest.approx(ratio, rel=1e-9)
        assert model.plain_tps([c])[0] == cm.plain_tps([c])[0]
    noisy = TrafficProfile(cm.n_parallel, acceptance=counts(1.2, 40, 0.12))
    wide, _, _ = observed_in_place(cm, noisy, "prod")
    narrow_p = model.predict(Policy.always(), [2])
    wide_p = wide.predict(Policy.always(), [2])
    assert wide_p.upper[0] - wide_p.lower[0] > narrow_p.upper[0] - narrow_p.lower[0]
    # not enough seen, or nothing drafted: the profile's stands, and the reason says why
    few = TrafficProfile(cm.n_parallel, acceptance=counts(1.2, 3, 0.01))
    same, why, none = observed_in_place(cm, few, "prod")
    assert same is cm and none is None and "is not enough" in why.text
    idle = TrafficProfile(cm.n_parallel, acceptance=AcceptanceCounts(readings=5))
    same, why, _ = observed_in_place(cm, idle, "prod")
    assert same is cm and "no draft was made" in why.text


def test_observed_acceptance_interval_is_no_wider_than_it_needs_to_be() -> None:
    """Identical readings (every request accepting alike) leave no spread: the interval is
    the estimate; a spread between readings widens it."""
    same = AcceptanceCounts()
    for _ in range(20):
        same.add(100, 300, 120, [70, 40, 10])
    observed = observed_acceptance(same)
    assert isinstance(observed, ObservedAcceptance)
    assert observed.mean_length == pytest.approx(2.2)
    assert observed.rates == pytest.approx((0.7, 0.4, 0.1))
    lo, hi = observed.interval()
    assert hi - lo == pytest.approx(0.0, abs=1e-9)
    apart = AcceptanceCounts()
    for i in range(20):
        k = 1 if i % 2 else -1
        apart.add(100, 300, 120 + 10 * k, [70 + 5 * k, 40 + 5 * k, 10])
    lo, hi = observed_acceptance(apart).interval()  # type: ignore[union-attr]
    assert 0.02 < hi - lo < 0.2 and lo < 2.2 < hi
    assert math.isfinite(observed.se)


@pytest.mark.slow
def test_observe_recovers_a_mix_acceptance_and_recommend_the_truths_n(tmp_path: Path) -> None:
    """zigzag (np 6, n_max 3) served over HTTP with a mix of content: half its requests (by
    seed) accept as code does (a mean accepted length of 3.2), the rest as chat (2.4); profiled
    in-process on a synthetic acceptance of 2.0, 30 % below the mix. Under the profile's
    acceptance drafting pays at one stream only, under the mix's at two as well (the truth's
    N=2, its neighbours 4 % and more behind at this traffic). observe's poller under tuner's own
    Poisson load reads the counters; their interval holds what they estimate. recommend
    --traffic on the same arrivals served in-process (seeded, virtual time: a decision no
    machine load can flip) answers within the tolerance (1 %) of the closed truth's best at the
    traffic's weights, and without the counters it does not."""
    from lab.method import HOST, twin_spec
    from lab.openmethod import observe
    from twinworlds import zigzag_world

    from tuner.decide import advice
    from tuner.decide.adaptive import profile_adaptively
    from tuner.measure.arrivals import poisson_offsets
    from tuner.measure.load import LoadGenerator, Workload
    from tuner.storage import traffic_profiles
    from tuner.storage.store import Store
    from tuner.twin.cmdline import launch_world, parse_args
    from tuner.twin.engine import Workload as Served
    from tuner.twin.inprocess import TwinBackend
    from tuner.twin.server import TwinServer
    from tuner.twin.truth import closed_truth
    from tuner.twin.world import world_to_toml

    mix = {"synth_len": 2.4, "classes": [{"name": "code", "share": 0.5, "synth_len": 3.2}]}
    real = zigzag_world(name="zigzag-mix", acceptance=mix, noise={"preset": "quiet"})
    profiled = real.with_updates(acceptance={"synth_len": 2.0})
    served_file = tmp_path / "mix.toml"
    served_file.write_text(world_to_toml(real.with_updates(noise={"preset": "off"})))
    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    profile_adaptively(
        store, twin_spec(profiled), tmp_path, host_name=HOST,
        backend=TwinBackend(profiled, switch="live"), switch="live", budget_s=600.0,
    )  # fmt: skip

    argv = [
        "--model", str(served_file), "--port", "0", "--parallel", str(real.n_parallel),
        "--ctx-size", str(4096 * real.n_parallel), "--kv-unified", "--noise", "off",
        "--speed", "50", "--metrics", "--props", "--poll", "0", "--model-draft", "twin-draft",
        "--spec-type", "draft-simple", "--spec-draft-n-max", str(real.n_max),
    ]  # fmt: skip
    args = parse_args(argv, env={})
    served_world, policy = launch_world(args)
    server = TwinServer(args, served_world, policy, log=lambda _: None).start_in_thread()
    rate, span = 0.4, 600.0
    offsets = poisson_offsets(rate, span, seed=3)
    samples: list = []

    def offer() -> None:
        generator = LoadGenerator(server.url, Workload(prompt_tokens=32, max_tokens=128))
        samples.extend(generator.run_arrivals(offsets, round_key=1)[1])

    seen = TrafficProfile(real.n_parallel)
    try:
        with Poller(server.url, clock=time.perf_counter, interval_s=0.05) as poller:
            load = threading.Thread(target=offer, daemon=True)
            load.start()
            while load.is_alive():
                poller.step(seen)
            for _ in range(6):
                poller.step(seen)
            view = poller.view
    finally:
        server.stop_thread()
    assert samples and all(s.ok for s in samples)
    observed = observed_acceptance(seen.acceptance)
    assert observed is not None and observed.enough() is None, observed
    # what the counters estimate, from a long in-process run of the served world: within
    # the interval (one realisation, held to the 99 % one; the 90 % one's coverage is
    # test_the_interval_of_observed_acceptance_covers_what_it_estimates's), 30 % above the
    # profile's
    target = estimand(real, rate)
    lo, hi = observed.interval(0.99)
    assert lo <= target <= hi, (lo, target, hi)
    assert observed.mean_length / profiled.mean_accept_len() - 1 > 0.25
    # the counters agree with what the load generator counted for its own requests
    assert seen.acceptance.accepted == sum(s.draft_accepted for s in samples)
    assert seen.acceptance.draft_tokens == sum(s.draft_n for s in samples)

    # The decision is judged on the same traffic served in-process, in virtual time and seeded
    # (the HTTP run's occupancy moves with the machine's load, and the answer with it): what
    # observe would record of the served world under these arrivals, counters included.
    arrivals = Served.poisson(rate, span, output_tokens=128, prompt_tokens=32, seed=3)
    seen = observe(real, policy, arrivals, seed=3)
    assert observed_acceptance(seen.acceptance).enough() is None
    traffic_profiles.save(store, "prod", view, seen.to_dict(), "complete")
    blind = TrafficProfile.from_dict({**seen.to_dict(), "acceptance": {}})
    traffic_profiles.save(store, "blind", view, blind.to_dict(), "complete")
    # the closed-loop study (busy-time weights), whose truth is the closed truth below
    with_counters = advice.recommend(store, real.model_name, HOST, traffic="prod", closed_loop=True)
    without = advice.recommend(store, real.model_name, HOST, traffic="blind", closed_loop=True)
    # the open loop (the default where the fit has arrival costs) rests on it too, and says so
    opened = advice.recommend(store, real.model_name, HOST, traffic="prod")
    store.dispose()
    assert opened.sampler == "twin simulation", opened.reasons
    said = [r.text for r in opened.reasons if r.code is ReasonCode.OBSERVED_ACCEPTANCE]
    assert said and "in place of the profile's" in said[0], opened.reasons
    codes = [r.code for r in with_counters.reasons]
    assert ReasonCode.OBSERVED_ACCEPTANCE in codes
    weights = {c: w for c, w in seen.weights(real.n_parallel).items() if w > 0}
    truth = closed_truth(real, concurrency=sorted(weights)).best(weights)
    regret = truth.regret(with_counters.policy)
    blind_regret = truth.regret(without.policy)
    assert regret <= TOLERANCE, (with_counters.max_slots, truth.best, regret, weights)
    assert blind_regret > 2 * TOLERANCE, (without.max_slots, truth.best, blind_regret)
