"""Occupancy under random arrivals: a birth-death queue over the number of generating slots.

Closed levels (c streams that start together) measure what a server delivers while c slots
generate: tps(c), from the cost model. A served box sees requests arrive at random instead, and
how many slots generate then depends on the policy: a faster server empties its slots sooner.
This module turns tps(c) under a policy, an arrival rate and a mean output length into that
occupancy and the figures operators ask for.

The model: requests arrive as a Poisson process of rate lam (requests/s) and each generates L
tokens on average. With c slots generating the server delivers tps(c) tokens/s in all, so
requests finish at rate mu_c = tps(c) / L (state-dependent exponential service: M/M/c with the
measured batching curve in place of c identical servers). Above n_slots requests wait for a
slot and the server goes on at mu_n, a geometric tail folded into the state "all slots busy".
pi_c is proportional to prod_{k<=c} lam / mu_k.

Left out, and why it is enough for choosing N: prefill (it is outside the decode window the
cost model describes, and a threshold does not change it) and the spread of output lengths
(exponential service stands in for it; benchmarks/openloop.py sets the prediction beside
measured open-loop runs).

Time per output token is what one client sees: at c generating slots each stream gets a token
every c / tps(c) seconds. Its mean over tokens is E[c] / E[tps] (each state weighted by the
tokens it serves); its quantiles are taken over the same token-weighted distribution, which is
wider than the distribution of per-request means a load generator reports (a request averages
over the states it lives through), so a p95 limit met here is met there too.

Pure numpy; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SATURATED_RHO = 1.0 - 1e-9  # at or above this utilisation of a full server the queue grows


@dataclass(frozen=True)
class Occupancy:
    """The stationary number of generating slots under one policy at one arrival rate."""

    rate: float  # arrivals per second
    probabilities: np.ndarray  # P(c slots generating), c = 0..n_slots (waiting ones in n_slots)
    saturated: bool  # arrivals outrun the full server: the queue grows without bound

    @property
    def mean_generating(self) -> float:
        return float(np.arange(len(self.probabilities)) @ self.probabilities)


def occupancy(tps: np.ndarray, rate: float, mean_output_tokens: float) -> Occupancy:
    """pi_c for c = 0..n from tps[c-1] (aggregate tok/s at c generating, c = 1..n)."""
    tps = np.asarray(tps, dtype=float)
    if rate <= 0:
        raise ValueError(f"arrival rate must be above 0, got {rate}")
    if mean_output_tokens <= 0:
        raise ValueError(f"mean output length must be above 0, got {mean_output_tokens}")
    if len(tps) == 0 or np.any(tps <= 0):
        raise ValueError("tok/s must be above 0 at every level")
    mu = tps / mean_output_tokens
    n = len(tps)
    rho_full = rate / mu[-1]
    if rho_full >= SATURATED_RHO:
        probs = np.zeros(n + 1)
        probs[-1] = 1.0
        return Occupancy(rate, probs, True)
    # Unnormalised weights in log space (a busy server at a low rate spans many decades).
    log_w = np.concatenate([[0.0], np.cumsum(np.log(rate) - np.log(mu))])
    # States above n (waiting requests) carry w_n * rho^k, k >= 1: fold them into state n.
    log_w[-1] += -np.log1p(-rho_full)
    w = np.exp(log_w - log_w.max())
    return Occupancy(rate, w / w.sum(), False)


def _token_weights(tps: np.ndarray, occ: Occupancy) -> tuple[np.ndarray, np.ndarray]:
    """Per busy state c = 1..n: time per output token (ms) and the share of tokens served."""
    c = np.arange(1, len(tps) + 1, dtype=float)
    served = occ.probabilities[1:] * tps
    return 1000.0 * c / tps, served / served.sum()


def mean_tpot_ms(tps: np.ndarray, occ: Occupancy) -> float:
    """Mean time per output token over all tokens served: E[c] / E[tps] in ms."""
    tps = np.asarray(tps, dtype=float)
    c = np.arange(1, len(tps) + 1, dtype=float)
    busy = occ.probabilities[1:]
    return float(1000.0 * (busy @ c) / (busy @ tps))


def tpot_quantile_ms(tps: np.ndarray, occ: Occupancy, q: float = 0.95) -> float:
    """The q-quantile of time per output token over tokens served (ms)."""
    tps = np.asarray(tps, dtype=float)
    per_token, share = _token_weights(tps, occ)
    order = np.argsort(per_token, kind="stable")
    cumulative = np.cumsum(share[order])
    k = int(np.searchsorted(cumulative, q - 1e-12))
    return float(per_token[order][min(k, len(order) - 1)])


def saturation_rate(tps: np.ndarray, mean_output_tokens: float) -> float:
    """The arrival rate a full server just keeps up with (requests/s)."""
    return float(np.asarray(tps, dtype=float)[-1] / mean_output_tokens)


def capacity(
    tps: np.ndarray,
    mean_output_tokens: float,
    slo_tpot_ms: float,
    q: float = 0.95,
    iterations: int = 40,
) -> float:
    """The highest arrival rate (requests/s) whose q-quantile time per output token stays at or
    under slo_tpot_ms, short of saturation; 0 when even one stream alone is too slow.

    The quantile grows with the rate wherever more generating slots make each token slower,
    which batching does, so bisection on the rate finds the edge.
    """
    tps = np.asarray(tps, dtype=float)
    if slo_tpot_ms <= 0:
        raise ValueError(f"the time-per-token limit must be above 0, got {slo_tpot_ms}")
    if 1000.0 / tps[0] > slo_tpot_ms:
        return 0.0
    top = saturation_rate(tps, mean_output_tokens) * SATURATED_RHO

    def meets(rate: float) -> bool:
        return tpot_quantile_ms(tps, occupancy(tps, rate, mean_output_tokens), q) <= slo_tpot_ms

    if meets(top):
        return top
    lo, hi = 0.0, top
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if mid > 0 and meets(mid):
            lo = mid
        else:
            hi = mid
    return lo


def rate_for_mean_generating(
    tps: np.ndarray, mean_output_tokens: float, target: float, iterations: int = 60
) -> float:
    """The arrival rate at which the mean number of generating slots is target (bisection):
    how a benchmark picks rates that load the server to a chosen depth."""
    tps = np.asarray(tps, dtype=float)
    if not 0 < target < len(tps):
        raise ValueError(f"target must lie in (0, {len(tps)}), got {target}")
    lo, hi = 0.0, saturation_rate(tps, mean_output_tokens) * SATURATED_RHO
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if mid > 0 and occupancy(tps, mid, mean_output_tokens).mean_generating < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
