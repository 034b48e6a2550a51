"""The frozen set of twin worlds (tests/lab/frozen.py, profiles/twin/frozen/): the committed files
are what the generator makes, byte for byte; every world loads; the manifest's figures and tags
hold on each world where a cheap check exists (ranges, weights, noise, the design's expected
throughput, plain rows against the engine); the set covers what issue 25 asks of it.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

import pytest
from lab.frozen import (
    CONCENTRATED_SHARE,
    MANIFEST,
    WORLD_COUNT,
    Entry,
    base_levels,
    best_n,
    costs_of,
    expected_tps,
    load_manifest,
    render_set,
    select,
    sign_changes,
    sign_pattern,
    write_set,
)

from tuner.errors import ConfigError
from tuner.policy import Policy
from tuner.twin import closed_level, load_world

REPO = Path(__file__).resolve().parent.parent
FROZEN = REPO / "profiles" / "twin" / "frozen"


@pytest.fixture(scope="module")
def entries() -> list[Entry]:
    return load_manifest(FROZEN)


@pytest.fixture(scope="module")
def worlds(entries: list[Entry]) -> dict[str, object]:
    return {e.name: load_world(FROZEN / e.file) for e in entries}


def test_the_committed_set_is_what_the_generator_makes(tmp_path: Path) -> None:
    written = write_set(tmp_path)
    made = {p.name: p.read_bytes() for p in written}
    committed = {p.name: p.read_bytes() for p in FROZEN.glob("*.toml")}
    assert set(made) == set(committed), set(made) ^ set(committed)
    changed = [name for name in made if made[name] != committed[name]]
    assert not changed, f"regenerate or revert (never adjust a world by hand): {changed}"


def test_every_world_loads_and_matches_its_entry(
    entries: list[Entry], worlds: dict[str, object]
) -> None:
    assert len(entries) == WORLD_COUNT >= 50
    assert len({e.name for e in entries}) == len({e.model_name for e in entries}) == len(entries)
    assert len({e.seed for e in entries}) == len(entries)
    for e in entries:
        w = worlds[e.name]
        assert w.name == e.name and w.model_name == e.model_name
        assert (w.n_parallel, w.n_max) == (e.n_parallel, e.n_max)
        assert 4 <= w.n_parallel <= 16 and 2 <= w.n_max <= 8
        assert 1.5 <= w.mean_accept_len() <= 5.0
        assert w.mean_accept_len() == pytest.approx(e.accept_len, abs=1e-4)
        assert w.depth.ms_per_row_per_1k == e.depth_ms_per_row_per_1k
        assert list(e.base_levels) == base_levels(e.n_parallel)
        # noise: the file's preset is the entry's, and "quiet" means the quiet preset alone
        assert (e.noise == "quiet") == (e.noise_preset == "quiet")
        resolved = w.noise.resolve()
        if e.noise_preset == "quiet":
            assert w.noise.preset == "quiet" and resolved.spell_slowdown == 0
        else:
            assert w.noise.preset == "vm" and resolved.spell_slowdown > 0
        if e.noise_preset == "vm":
            assert e.regime == "cpu" and w.noise.log_sd is None


def test_the_weights_are_uniform_or_seventy_percent_at_one_level(entries: list[Entry]) -> None:
    for e in entries:
        w = e.weights
        assert len(w) == e.n_parallel and math.isclose(sum(w), 1.0, abs_tol=1e-5)
        if e.traffic == "uniform":
            assert e.concentrated_at == 0 and max(w) - min(w) < 1e-6
        else:
            at = e.concentrated_at
            assert w[at - 1] == CONCENTRATED_SHARE
            rest = [x for c, x in enumerate(w, start=1) if c != at]
            assert max(rest) - min(rest) < 1e-6
        assert e.weight_map() == {c: x for c, x in enumerate(w, start=1)}


def test_the_design_figures_follow_from_each_world(
    entries: list[Entry], worlds: dict[str, object]
) -> None:
    for e in entries:
        costs = costs_of(worlds[e.name])
        levels = range(1, e.n_parallel + 1)
        plain = [costs.gain(c, "plain") for c in levels]
        assert sign_pattern(plain) == e.gain_signs
        diffs = [
            x * (costs.tps(c, "spec") - costs.tps(c, "off"))
            for c, x in zip(levels, e.weights, strict=True)
        ]
        assert best_n(diffs) == e.best_n
        assert (e.best_n in e.base_levels) == (e.crossover == "inside")
        assert e.tags == (f"crossover-{e.crossover}", e.noise, e.traffic)
        assert costs.gain(1) == pytest.approx(e.gain_at_one, abs=1e-4) and costs.gain(1) > 0
        if e.shape == "zigzag":
            assert sign_changes(plain) == 2, (e.name, e.gain_signs)


def test_the_expected_plain_rows_are_the_engines(
    entries: list[Entry], worlds: dict[str, object]
) -> None:
    """Plain runs make no draws: one noise-free closed level is its truth. Checked at the
    lowest and highest level of a world of each shape and regime."""
    seen: set[tuple[str, str]] = set()
    for e in entries:
        if (e.shape, e.regime) in seen:
            continue
        seen.add((e.shape, e.regime))
        w = worlds[e.name]
        for c in (1, e.n_parallel):
            truth = closed_level(w, Policy.plain(), c, noise=False).window_tps()
            assert expected_tps(w, Policy.plain(), c) == pytest.approx(truth, rel=2e-3), e.name
    assert len(seen) == 8


def test_the_set_covers_what_it_must(entries: list[Entry], worlds: dict[str, object]) -> None:
    count = len(entries)
    tags = Counter(t for e in entries for t in e.tags)
    for tag in (
        "crossover-inside",
        "crossover-outside",
        "quiet",
        "noisy",
        "uniform",
        "concentrated",
    ):
        assert tags[tag] >= count // 3, tags
    assert Counter(e.shape for e in entries).keys() == {"smooth", "plateau", "sawtooth", "zigzag"}
    assert {e.n_parallel for e in entries} == {4, 5, 6, 8, 10, 12, 16}
    assert {e.n_max for e in entries} == set(range(2, 9))
    assert {e.noise_preset for e in entries} == {"quiet", "mid", "vm"}
    assert {e.regime for e in entries} == {"cpu", "gpu"}
    lengths = [e.accept_len for e in entries]
    assert min(lengths) < 2.0 and max(lengths) > 4.5
    assert any(
        any("rates" in str(k) for k in worlds[e.name].acceptance.model_dump(exclude_none=True))
        for e in entries
    )
    # crossovers from one stream to above -np
    assert any(e.spec_wins_through == 1 for e in entries)
    assert any(e.spec_wins_through == e.n_parallel for e in entries)
    assert sum(e.depth_ms_per_row_per_1k > 0 for e in entries) >= 2
    # plateaus: equal cost over a range of rows; saw-teeth: slots_ms not monotone
    plateau = [worlds[e.name] for e in entries if e.shape == "plateau"]
    assert all(any(a[1] == b[1] for a, b in itertools.pairwise(w.step.rows_ms)) for w in plateau)
    saw = [worlds[e.name] for e in entries if e.shape == "sawtooth"]
    for w in saw:
        per_slot = [y / x for x, y in w.step.slots_ms]
        assert max(per_slot) > min(per_slot) * 1.1


def test_select_reads_names_indices_and_ranges(entries: list[Entry]) -> None:
    picked = select(entries, "frozen-03, 0, 10-12")
    assert [e.name for e in picked] == [
        "frozen-03",
        "frozen-00",
        "frozen-10",
        "frozen-11",
        "frozen-12",
    ]
    assert select(entries, None) == entries
    with pytest.raises(ConfigError, match="no world"):
        select(entries, "frozen-99")


def test_the_manifest_says_how_the_set_was_made() -> None:
    text = (FROZEN / MANIFEST).read_text()
    assert text.startswith("# The frozen set of twin worlds")
    assert "never adjusted after seeing how the tuner does" in text
    assert render_set([])[MANIFEST].splitlines()[:5] == text.splitlines()[:5]
