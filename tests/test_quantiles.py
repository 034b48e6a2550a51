"""The normal and t quantiles every interval uses (tuner/model/quantiles.py): the same figures as
scipy.stats to the last bit, and a command's start-up that does not import scipy.stats."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

from tuner.model.quantiles import norm_ppf, t_ppf

REPO = Path(__file__).resolve().parent.parent
PS = [1e-9, 0.001, 0.025, 0.05, 0.3, 0.5, 0.8, 0.9, 0.95, 0.975, 0.995, 1 - 1e-9]
DFS = [0.5, 1.0, 1.4079, 2.0, 3.0, 6.98, 10.0, 100.0, 1e6, math.inf]


@pytest.mark.parametrize("p", PS)
def test_the_quantiles_are_scipy_stats_own(p: float) -> None:
    assert norm_ppf(p) == float(stats.norm.ppf(p))
    for df in DFS:
        assert t_ppf(p, df) == float(stats.t.ppf(p, df)), df


def test_the_ends_and_no_degrees_of_freedom() -> None:
    for df in (1.0, math.inf):
        assert t_ppf(0.0, df) == -math.inf == float(stats.t.ppf(0.0, df))
        assert t_ppf(1.0, df) == math.inf == float(stats.t.ppf(1.0, df))
    assert norm_ppf(0.0) == -math.inf and norm_ppf(1.0) == math.inf
    for df in (0.0, -1.0, math.nan):
        assert math.isnan(t_ppf(0.95, df))


def test_a_command_that_reads_stored_data_imports_no_scipy_stats() -> None:
    """recommend's and tune's paths, from the CLI down: scipy.stats is a second of start-up."""
    code = (
        "import sys, tuner.cli.app, tuner.decide.advice, tuner.decide.tune, "
        "tuner.decide.watch.watcher; "
        "print(' '.join(m for m in ('scipy.stats', 'scipy.optimize') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True
    )
    assert out.stdout.split() == []
