"""The order an interleaved profile measures in: which launch each pass runs on, and the order
it walks its (depth, concurrency) cells. Pure scheduling: the launches and measurements are
recorded, not run (the live tests in test_profile and test_depth run them on the bench)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner.measure.profiler import Cell, Profiler
from tuner.measure.spec import ProfileSpec
from tuner.policy import Policy
from tuner.storage.engine import Store

CELLS: list[Cell] = [(0, 1), (0, 8), (1024, 1), (1024, 8), (2048, 1), (2048, 8)]


class Recorder:
    """Stands in for the launches and the measurements; keeps every repeat it was asked for."""

    def __init__(self, profiler: Profiler) -> None:
        self.profiler = profiler
        self.launches: list[str] = []
        self.walks: list[tuple[str, int, list[Cell]]] = []  # (config, pass, cells in order)
        self.repeats: dict[tuple[str, int, int], list[dict]] = {}

    @contextlib.contextmanager
    def launched(self, policy: Policy, pass_index: int | None = None) -> Iterator[object]:
        self.launches.append(policy.config_name)
        yield SimpleNamespace(url=f"http://launch-{len(self.launches)}", name=policy.config_name)

    def measure_cells(
        self,
        server_url: str,
        config: Policy,
        levels: Sequence[Cell],
        pass_index: int | None = None,
        server: object = None,
    ) -> None:
        assert pass_index is not None
        self.walks.append((config.config_name, pass_index, list(levels)))
        for depth, concurrency in levels:
            self.repeats.setdefault((config.config_name, depth, concurrency), []).append(
                {"pass": pass_index}
            )

    def repeats_by_cell(self, policies: list[Policy] | None = None) -> dict:
        return {key: list(reps) for key, reps in self.repeats.items()}


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    spec = ProfileSpec.model_validate(
        {
            "name": "order",
            "model_name": "order-model",
            "server": {"binary": "/x/llama-server", "model": "/x/m.gguf", "n_parallel": 8},
            "speculative": {"args": []},
            # Exactly three repeats per cell: every pass measures every cell.
            "workload": {"min_repeats": 3, "max_repeats": 3},
        }
    )
    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    profiler = Profiler(store, spec, tmp_path)
    recorder = Recorder(profiler)
    for name in ("launched", "measure_cells", "repeats_by_cell"):
        monkeypatch.setattr(profiler, name, getattr(recorder, name))
    yield recorder
    store.dispose()


def test_passes_share_launches_and_alternate_the_walk(recorded: Recorder) -> None:
    plain, spec = Policy.plain(), Policy.always()
    recorded.profiler.run_interleaved([plain, spec], CELLS)

    # A, B B, A A, B: the policy that ends a pass starts the next on its launch.
    assert recorded.launches == ["plain", "spec", "plain", "spec"]
    assert [(config, p) for config, p, _ in recorded.walks] == [
        ("plain", 0),
        ("spec", 0),
        ("spec", 1),
        ("plain", 1),
        ("plain", 2),
        ("spec", 2),
    ]
    # Both policies walk a pass the same way (paired repeats stay one pass apart), and every
    # other pass walks it back: deep to shallow after shallow to deep.
    for config, p, walk in recorded.walks:
        assert walk == (CELLS if p % 2 == 0 else CELLS[::-1]), (config, p)
    # The second pass on a shared launch starts where the first one ended.
    assert recorded.walks[1][2][-1] == recorded.walks[2][2][0] == (2048, 8)


def test_closed_cells_leave_the_walk(recorded: Recorder) -> None:
    """A resumed pass measures only what its policy has not measured in it yet."""
    plain, spec = Policy.plain(), Policy.always()
    recorded.repeats[("plain", 0, 1)] = [{"pass": 0}]
    recorded.profiler.run_interleaved([plain, spec], CELLS)

    first = recorded.walks[0]
    assert first[:2] == ("plain", 0) and (0, 1) not in first[2]
    assert all(len(reps) == 3 for reps in recorded.repeats.values())
