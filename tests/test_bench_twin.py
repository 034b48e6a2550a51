"""The bench's two regimes on their twin: the claims about speed that live bench tests cannot hold
without a bet.

A live profile of the bench shows drafting about +55 % ahead at one stream and about 20 % behind
at eight, and recommend's N drafts where drafting clearly pays; on the project's 2-core VM a
spell of the machine (10-30 % slow, seconds to minutes) can flip either. The bench world
(profiles/twin/bench-smollm2-cpu.toml, calibrated from the bench's own figures) and its n-max 3
regime (the same machine, the bench's second spec: n-max 3, synthetic length 2.0) hold the same
claims against a truth that is known, seeded, in virtual time: what tests/test_profile.py and
the live recommend tests asserted live until the tier was made noise-proof. The live tests keep
what only llama-server can show (what is stored, drafting by counters, launching).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lab.method import HOST, twin_spec
from sqlalchemy import select
from twinworlds import world

from tuner.decide import advice
from tuner.decide.adaptive import profile_adaptively
from tuner.storage.orm import Level
from tuner.storage.store import Store
from tuner.twin import World, world_from_dict
from tuner.twin.inprocess import TwinBackend
from tuner.twin.truth import closed_truth

# A spec/plain margin this wide is a clear gain or loss (the live test's TIE): a decision must
# follow it; a closer one is the objective's business (tests/test_decisions.py).
CLEAR = 0.10


def regime(name: str) -> World:
    """bench: the bundled bench's spec (n-max 6, synthetic length 3.5); nmax3: its second spec on
    the same machine (n-max 3, synthetic length 2.0), the hard case with small margins."""
    bench = world("bench")
    if name == "bench":
        return bench
    data = bench.model_dump()
    data.update(
        name="bench-smollm2-cpu-nmax3",
        model_name="twin-smollm2-135m-f32-nmax3",
        n_max=3,
        acceptance={"synth_len": 2.0},
    )
    return world_from_dict(data)


def _profile(w: World, tmp_path: Path, seed: int, **spec: object) -> Store:
    """`tuner profile` of the world as on the patched bench: drafting policies switched live on
    one launch, adaptive levels within the default budget unless spec says otherwise."""
    budget = spec.pop("budget_s", 600.0)
    store = Store(f"sqlite:///{tmp_path / f'{w.name}-{seed}.db'}")
    backend = TwinBackend(w, switch="live", seed=seed)
    profile_adaptively(
        store,
        twin_spec(w, seed=seed, **spec),  # type: ignore[arg-type]
        tmp_path,
        host_name=HOST,
        backend=backend,
        switch="live",
        budget_s=budget,  # type: ignore[arg-type]
        seed=seed,
    )
    return store


def test_the_bench_world_holds_the_bench_contrast_and_a_profile_measures_it(
    tmp_path: Path,
) -> None:
    """Drafting clearly ahead at one stream and clearly behind at eight (the bounds the live
    test held: spec/plain above 1.12 and below 0.94), in the world's truth and in what a profile
    of it on the VM's noise stores as its levels."""
    w = regime("bench")
    truth = closed_truth(w, concurrency=[1, 8], rel_se=0.01)
    assert truth.gain(1) > 0.12 and truth.gain(8) < -0.06, (truth.gain(1), truth.gain(8))
    store = _profile(w, tmp_path, seed=0, levels=(1, 8), budget_s=0.0)
    with store.session() as session:
        tps = {
            (lv.config, lv.concurrency): lv.tokens_per_second
            for lv in session.scalars(select(Level))
        }
    store.dispose()
    contrast = (tps[("spec", 1)] / tps[("plain", 1)], tps[("spec", 8)] / tps[("plain", 8)])
    assert contrast[0] > 1.12 and contrast[1] < 0.94, contrast


@pytest.mark.slow  # a profile with adaptive levels, its fit and the truth: 10-15 s each
@pytest.mark.parametrize("name", ["bench", "nmax3"])
def test_recommend_after_a_profile_drafts_where_drafting_clearly_pays(
    tmp_path: Path, name: str
) -> None:
    """profile (adaptive levels included) then recommend, as a user runs them: N lets every
    level where the truth puts drafting more than 10 % ahead draft, and stops it at every level
    where it is more than 10 % behind (N=1 cannot stop it at one stream: that is allowed)."""
    w, seed = regime(name), 0
    truth = closed_truth(w, rel_se=0.005)
    store = _profile(w, tmp_path, seed)
    answer = advice.standing(store, w.model_name, HOST, seed=seed)
    store.dispose()
    n = answer.policy.effective(w.n_parallel)  # N=0 (always draft) counts as n_parallel
    gains = {c: round(truth.gain(c), 3) for c in truth.concurrency}
    for c, gain in gains.items():
        drafts = c <= n
        if gain > CLEAR:
            assert drafts, f"drafting {gain:+.0%} ahead at {c} streams, but N={n}: {gains}"
        elif gain < -CLEAR:
            assert not drafts or (n, c) == (1, 1), f"{gain:+.0%} at {c} streams, N={n}: {gains}"
