"""The twin's noise (tuner.twin.noise): the "vm" preset gives the round CVs measured on the
project's 2-core VM, "quiet" about 1 %, and the noise moves no long-run average.

Rounds are measured as the bench's noise was on the VM (a plain llama-server -np 8 -kvu -t 2 on
the 2-core AMD EPYC VM, 3-4 launches): one engine per launch, 128-token rounds of 1 and 8 streams
alternating, 8 rounds of each per launch, plain server, on the bench-like world. The VM's round
CV: 13.3 % at 1 stream, 5.3 % at 8; a launch's 8-round mean spread 4.7 % and 1.7 %.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tuner.twin import Engine, NoiseProcess, NoiseSpec, World, load_world

REPO = Path(__file__).resolve().parent.parent
BENCH_WORLD = REPO / "profiles" / "twin" / "bench-smollm2-cpu.toml"


def with_noise(world: World, **spec: object) -> World:
    return world.model_copy(update={"noise": NoiseSpec(**spec)})


def rounds(world: World, launches: int, per_launch: int = 8) -> dict[int, list[list[float]]]:
    """Round tok/s by level, one list per launch."""
    out: dict[int, list[list[float]]] = {1: [], 8: []}
    for launch in range(launches):
        engine = Engine(world, None, seed=7000 + launch)
        per: dict[int, list[float]] = {1: [], 8: []}
        for r in range(per_launch):
            for streams in (1, 8):
                tps = engine.closed_level(streams, 128, seed=r).window_tps()
                assert tps is not None
                per[streams].append(tps)
        for streams, values in per.items():
            out[streams].append(values)
    return out


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values)


def test_the_vm_preset_gives_the_round_cvs_of_the_vm() -> None:
    world = with_noise(load_world(BENCH_WORLD), preset="vm")
    by_level = rounds(world, launches=60)
    one = cv([v for launch in by_level[1] for v in launch])
    eight = cv([v for launch in by_level[8] for v in launch])
    # the VM's: 13.3 % and 5.3 % (the module docstring); 60 launches of this world land within
    # about 1.5 points of the preset's long-run 13.4 % and 5.4 %
    assert 0.103 < one < 0.163, one
    assert 0.038 < eight < 0.068, eight
    assert one > 1.8 * eight  # short steps are noisier: the additive part
    # launch-to-launch: a launch's 8-round mean spreads as round noise predicts (4.7 % / 1.7 %)
    means = [statistics.fmean(launch) for launch in by_level[1]]
    assert cv(means) < 1.6 * one / 8**0.5
    # adjacent rounds share the slow stretches: round tok/s at 8 streams correlate with the
    # 1-stream round just before them
    pairs = [
        (a, b)
        for ones, eights in zip(by_level[1], by_level[8], strict=True)
        for a, b in zip(ones, eights, strict=True)
    ]
    assert statistics.correlation([a for a, _ in pairs], [b for _, b in pairs]) > 0.1


def test_the_quiet_preset_gives_about_one_percent() -> None:
    world = with_noise(load_world(BENCH_WORLD), preset="quiet")
    by_level = rounds(world, launches=30)
    for streams in (1, 8):
        value = cv([v for launch in by_level[streams] for v in launch])
        assert 0.005 < value < 0.016, (streams, value)


def test_spells_come_and_go_and_the_noise_keeps_the_long_run_mean() -> None:
    params = NoiseSpec(preset="vm").resolve()
    process = NoiseProcess(params, seed=3)
    cost, total, in_spell, steps = 0.05, 0.0, 0.0, 0
    spells = 0
    was = process.in_spell
    while total < 10000.0:  # virtual seconds
        d = process.duration(cost)
        total += d
        in_spell += d if process.in_spell else 0.0
        spells += process.in_spell and not was
        was = process.in_spell
        steps += 1
    # mean step time stays the noise-free cost (the multiplicative part is normalised)
    assert total / steps == pytest.approx(cost, rel=0.02)
    assert in_spell / total == pytest.approx(params.spell_share, abs=0.015)
    assert 4 < spells < 35  # about one every 612 s


def test_noise_is_deterministic_per_seed_and_off_is_off() -> None:
    params = NoiseSpec(preset="vm").resolve()
    a = [NoiseProcess(params, seed=1).duration(0.04) for _ in range(3)]
    b = [NoiseProcess(params, seed=1).duration(0.04) for _ in range(3)]
    assert a == b
    walk = NoiseProcess(params, seed=1)
    path = [walk.duration(0.04) for _ in range(200)]
    assert len(set(path)) == 200 and statistics.stdev(path) > 0.001
    assert NoiseSpec(preset="off").resolve().is_off
    assert NoiseSpec(preset="quiet", log_sd=0.2).resolve().log_sd == 0.2
