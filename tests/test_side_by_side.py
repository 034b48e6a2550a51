"""Side by side (ServerBackend(side_by_side=True)): plain's launch and a drafting launch held up
together, each on its own port, their rounds alternating at a cell (A B B A) the way the live
switch alternates drafting policies, so `tune --plain-live` and the regret judge pair plain's
rounds with the answer's seconds apart. Launched from a spec, with the twin server as the
binary (fast) and with the real bench llama-server: what is tested is the backend's handling of
launches and the schedule over them; the drafting server drafts and the plain one does not,
which shows each round reached the right launch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tunerproc import TWIN_BENCH_WORLD, TWIN_SPEC, twin_server_script

from tuner.bench import Bench
from tuner.measure.backend import ServerBackend
from tuner.measure.plan import ProgressEvent
from tuner.measure.profiler import Profiler, gather_context
from tuner.measure.spec import load_spec
from tuner.policy import Policy
from tuner.storage.store import Store

REPO = Path(__file__).resolve().parent.parent


def _twin_spec(folder: Path):
    return load_spec(
        TWIN_SPEC,
        [
            ("server.binary", str(twin_server_script(folder))),
            ("server.model", str(TWIN_BENCH_WORLD)),
            ("server.args", ["--kv-unified", "--speed", "20"]),
            ("workload.max_tokens", 24),
            ("workload.warmup", 0),
        ],
        check_files=False,
    )


def test_plain_and_a_threshold_alternate_on_two_launches_held_up(tmp_path: Path) -> None:
    _alternate_on_two_launches(_twin_spec(tmp_path), tmp_path)


@pytest.mark.bench
def test_two_bench_servers_held_up_side_by_side(bench: Bench, tmp_path: Path) -> None:
    spec = load_spec(
        REPO / "profiles" / "bench-smollm2-cpu.toml",
        [("workload.max_tokens", 24), ("workload.warmup", 0)],
        bench_refs=bench.as_refs,
    )
    _alternate_on_two_launches(spec, tmp_path)


def _alternate_on_two_launches(spec, tmp_path: Path) -> None:
    order: list[tuple[str, int]] = []

    def observe(event: ProgressEvent) -> None:
        if event.kind == "repeat":
            order.append((event.config, event.concurrency))

    backend = ServerBackend(spec, tmp_path / "logs", observe, switch="relaunch", side_by_side=True)
    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    profiler = Profiler(store, spec, tmp_path / "logs", observe, backend=backend)
    profiler.create_run(gather_context(spec, None), kind="sweep")
    plain, threshold = Policy.plain(), Policy.threshold(1).with_n_max(spec.speculative.n_max)
    try:
        profiler.run_pass({(0, 1): [plain, threshold], (0, 2): [plain, threshold]}, pairs=2)
        assert backend.launches == 2  # one each, not one per change of policy
        assert backend._up is not None and backend._parked is not None
        up = [backend._up.server, backend._parked.server]
        assert all(server.alive() for server in up) and up[0].url != up[1].url
        # at each cell the two alternate A B B A (or B A A B), cell after cell
        names = {plain.config_name, threshold.config_name}
        for cell in (1, 2):
            at = [config for config, c in order if c == cell]
            assert len(at) == 4 and set(at) == names
            assert at[0] == at[3] and at[1] == at[2] and at[0] != at[1]
        assert [c for _, c in order] in ([1] * 4 + [2] * 4, [2] * 4 + [1] * 4)

        rounds = profiler.repeats_by_cell()
        drafted = {
            (config, c): [r.get("window_drafted") or 0 for r in reps]
            for (config, _, c), reps in rounds.items()
        }
        # threshold 1 drafts at one stream: those rounds reached the drafting launch
        assert all(d > 0 for d in drafted[(threshold.config_name, 1)])
        assert all(d == 0 for c in (1, 2) for d in drafted[(plain.config_name, c)])

        # a third policy takes a launch of its own and stops the one idle longest
        profiler.run_pass({(0, 1): [Policy.always(spec.speculative.n_max)]})
        assert backend.launches == 3
        assert sum(server.alive() for server in up) == 1
    finally:
        backend.close()
        store.dispose()
    assert not any(server.alive() for server in up)
