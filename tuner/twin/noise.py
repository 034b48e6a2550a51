"""Step-time noise of a twin: a seeded process in virtual time, as a real machine's noise is.

Independent per-step jitter averages away over the 100+ steps of a round, which real rounds do
not: on the project's 2-core VM a 128-token round of 2-7 s has a CV of 13.3 % at 1 stream and
5.3 % at 8 (plain server), with spells in which a round runs about 30 % slow and adjacent rounds
share a spell, and launch-to-launch offsets small next to round noise. So a step of noise-free
cost C starting at virtual time t lasts

    C * launch * exp(x(t) + sx^2/2) * exp(s_a u(t) + s_a^2/2) * spell(t) * k * exp(e - se^2/2)

- x(t): an Ornstein-Uhlenbeck process in log space (sd sx = `log_sd`, correlation time
  `log_tau_s`): the machine running a little faster or slower for seconds at a time;
- u(t): a unit Ornstein-Uhlenbeck process (correlation time `add_tau_s`) scaled by
  s_a = `add_sd_ms` / C (at most 1): about `add_sd_ms` milliseconds per step whatever the step's
  size, work that shares the machine (on the VM: the load generator and the server's HTTP
  threads on the same two cores). It is what makes short steps (1 stream) relatively noisier
  than long ones (8 streams); taken in log space so a step never runs backwards;
- spell(t): a two-state Markov process, `1 + spell_slowdown` inside a spell (mean length
  `spell_mean_s`) and 1 between spells (mean gap `spell_gap_s`), k its normalisation;
- e: independent per step (sd se = `step_sd` of its log);
- launch: one draw per engine (sd `launch_sd` of its log), the launch-to-launch offset.

The terms are normalised so that the noise moves no long-run average: steps sample the
processes at their starts, more often where steps are short, so the long-run mean step is the
harmonic mean over time of the durations; each time process has E[1 / factor] = 1 over its
stationary law (hence the + s^2/2 and k = E[1 / spell]) and the per-step term E[factor] = 1.
A long run's tok/s therefore converges to the noise-free one, which is the truth
(tuner.twin.truth); noise only spreads rounds around it (a round's tok/s, a ratio, still has
the usual upward bias of a mean of ratios, as measured ones do).

Presets by name (`preset` in a world's [noise] table, fields given beside it override the
preset's): "off" (no noise), "quiet" (a GPU-like box: about 1 % round CV), "vm" (the project's
2-core VM, tuned on the bench-like world profiles/twin/bench-smollm2-cpu.toml to the round CVs
above: tests/test_twin_noise.py shows it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

PresetName = Literal["off", "quiet", "vm"]


@dataclass(frozen=True)
class NoiseParams:
    """A resolved noise model (see the module docstring for each field)."""

    log_sd: float = 0.0
    log_tau_s: float = 1.0
    add_sd_ms: float = 0.0
    add_tau_s: float = 1.0
    spell_slowdown: float = 0.0
    spell_mean_s: float = 10.0
    spell_gap_s: float = 600.0
    step_sd: float = 0.0
    launch_sd: float = 0.0

    @property
    def is_off(self) -> bool:
        return (
            self.log_sd == 0
            and self.add_sd_ms == 0
            and self.spell_slowdown == 0
            and self.step_sd == 0
            and self.launch_sd == 0
        )

    @property
    def spell_share(self) -> float:
        """Long-run share of time inside a spell."""
        return self.spell_mean_s / (self.spell_mean_s + self.spell_gap_s)


PRESETS: dict[str, NoiseParams] = {
    "off": NoiseParams(),
    "quiet": NoiseParams(log_sd=0.012, log_tau_s=3.0, step_sd=0.01, launch_sd=0.005),
    "vm": NoiseParams(
        log_sd=0.055,
        log_tau_s=1.5,
        add_sd_ms=7.5,
        add_tau_s=1.0,
        spell_slowdown=0.3,
        spell_mean_s=12.0,
        spell_gap_s=600.0,
        step_sd=0.03,
        launch_sd=0.005,
    ),
}


class NoiseSpec(BaseModel):
    """A world's [noise] table: a preset and optional overrides of its fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: PresetName = "quiet"
    log_sd: float | None = Field(None, ge=0.0, le=1.0)
    log_tau_s: float | None = Field(None, gt=0.0)
    add_sd_ms: float | None = Field(None, ge=0.0)
    add_tau_s: float | None = Field(None, gt=0.0)
    spell_slowdown: float | None = Field(None, ge=0.0, le=10.0)
    spell_mean_s: float | None = Field(None, gt=0.0)
    spell_gap_s: float | None = Field(None, gt=0.0)
    step_sd: float | None = Field(None, ge=0.0, le=1.0)
    launch_sd: float | None = Field(None, ge=0.0, le=1.0)

    def resolve(self) -> NoiseParams:
        """The preset with the given fields put over it."""
        base = PRESETS[self.preset]
        overrides = {k: v for k, v in self.model_dump(exclude={"preset"}).items() if v is not None}
        return NoiseParams(**{**base.__dict__, **overrides})


_BLOCK = 4096


class NoiseProcess:
    """One engine's noise, seeded: `duration(cost)` for each step in turn, `advance(dt)` over
    idle time. The same seed gives the same noise path for the same sequence of calls."""

    def __init__(self, params: NoiseParams, seed: int) -> None:
        self.params = params
        self._rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x6E6F6973])
        self._normals: list[float] = []
        self._uniforms: list[float] = []
        self._block = 64  # grows: a short run draws few numbers, a long one many
        p = params
        self._launch = math.exp(p.launch_sd * self._normal() + p.launch_sd**2 / 2)
        self._x = p.log_sd * self._normal()
        self._u = self._normal() if p.add_sd_ms else 0.0
        self._spell = self._uniform() < p.spell_share if p.spell_slowdown > 0 else False
        share = p.spell_share if p.spell_slowdown else 0.0
        spell_norm = (1.0 - share) + share / (1.0 + p.spell_slowdown)  # E[1 / spell]
        self._scale = math.exp(p.log_sd**2 / 2 - p.step_sd**2 / 2) * spell_norm
        self._add_s = p.add_sd_ms / 1000.0

    def _normal(self) -> float:
        if not self._normals:
            self._block = min(self._block * 2, _BLOCK)
            self._normals = self._rng.standard_normal(self._block).tolist()
        return self._normals.pop()

    def _uniform(self) -> float:
        if not self._uniforms:
            self._uniforms = self._rng.random(64).tolist()
        return self._uniforms.pop()

    @property
    def in_spell(self) -> bool:
        return self._spell

    def factor(self, cost: float) -> float:
        """The factor a step of this cost would get now, without the per-step term."""
        spell = 1.0 + self.params.spell_slowdown if self._spell else 1.0
        sa = min(self._add_s / cost, 1.0) if cost > 0 else 0.0
        return self._launch * math.exp(self._x + sa * self._u + sa * sa / 2) * spell * self._scale

    def duration(self, cost: float) -> float:
        """How long a step of noise-free cost `cost` (seconds) lasts if it starts now; the
        process then moves on by that duration."""
        p = self.params
        factor = self.factor(cost)
        if p.step_sd:
            factor *= math.exp(p.step_sd * self._normal())
        value = cost * factor
        self.advance(value)
        return value

    def advance(self, dt: float) -> None:
        """Move the processes on by dt seconds (exact transitions of each)."""
        if dt <= 0:
            return
        p = self.params
        if p.log_sd:
            decay = math.exp(-dt / p.log_tau_s)
            self._x = self._x * decay + p.log_sd * math.sqrt(1 - decay * decay) * self._normal()
        if p.add_sd_ms:
            decay = math.exp(-dt / p.add_tau_s)
            self._u = self._u * decay + math.sqrt(1 - decay * decay) * self._normal()
        if p.spell_slowdown:
            share = p.spell_share
            rate = 1.0 / p.spell_mean_s + 1.0 / p.spell_gap_s
            now = 1.0 if self._spell else 0.0
            stay_in = share + (now - share) * math.exp(-dt * rate)  # P(in a spell after dt)
            self._spell = self._uniform() < stay_in
