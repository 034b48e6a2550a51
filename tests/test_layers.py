"""The package layering of tuner/: no import from a lower package to a higher one or between
siblings, no import cycle between modules, and nothing of the tests or benchmarks imported.

Every `import` and `from ... import` of every module under tuner/ counts, at module level, inside
functions and under TYPE_CHECKING alike: a lazy import is still a dependency, it only moves the
moment it fails. A new package must be placed in LAYERS before the test passes.
"""

from __future__ import annotations

import ast
import itertools
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TUNER = REPO / "tuner"

# The layers, low to high: (group, rank, the modules it holds, by prefix). A module may import
# its own group and any group of a lower rank; groups of one rank are siblings and never import
# each other.
LAYERS: list[tuple[str, int, tuple[str, ...]]] = [
    # The shared types and base every layer speaks: the error hierarchy, TOML input, settings,
    # Policy, Recommendation and traffic shares. They sit below storage and decide alike, so
    # that storage can store a Recommendation without knowing who made it.
    (
        "base",
        0,
        (
            "tuner",  # tuner/__init__.py alone: the version
            "tuner.errors",
            "tuner.inputs",
            "tuner.jsonout",
            "tuner.settings",
            "tuner.policy",
            "tuner.recommendation",
            "tuner.traffic",
        ),
    ),
    # Pure numpy/scipy: the cost model knows nothing of where its rows came from.
    ("model", 1, ("tuner.model",)),
    # The database: stores rows and fits (model's types) and imports neither measure nor decide.
    ("storage", 2, ("tuner.storage",)),
    # Measuring a server: the schedule, the Backend protocol, the profiler and recorder (which
    # write through storage). It never imports the twin: the twin implements its Backend.
    ("measure", 3, ("tuner.measure",)),
    # Two things measured through measure's Backend and launcher, neither knowing the other:
    # the twin (a simulated llama-server with known truth: world, engine, noise, truth,
    # calibration, server, in-process backend), below the decisions it judges; and the bundled
    # bench (the real llama-server built and proven here).
    ("twin", 4, ("tuner.twin",)),
    ("bench", 4, ("tuner.bench",)),
    # The decisions: search over the model, recommend, settle N live, validate, watch.
    ("decide", 5, ("tuner.decide",)),
    # Reports draw what decide chose and storage holds.
    ("report", 6, ("tuner.report",)),
    # The only place that reads the environment and turns errors into exit codes.
    ("cli", 7, ("tuner.cli", "tuner.__main__")),
]


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module (or the package an imported name lives in)
    where: str  # path:line


def group_of(module: str) -> tuple[str, int] | None:
    """The layer a tuner module belongs to: the longest prefix in LAYERS that names it."""
    best: tuple[int, str, int] | None = None
    for group, rank, prefixes in LAYERS:
        for prefix in prefixes:
            inside = module == prefix or (prefix != "tuner" and module.startswith(prefix + "."))
            if inside and (best is None or len(prefix) > best[0]):
                best = (len(prefix), group, rank)
    return None if best is None else (best[1], best[2])


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(
    module: str, is_package: bool, tree: ast.AST, where: str, known: set[str]
) -> list[Import]:
    """Every import in tree (at any depth) of a module of the tuner package. `from P import n`
    counts as an import of P.n where that is a module, else of P."""
    found = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [
                f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in known else origin
                for alias in node.names
            ]
        for target in targets:
            if target == "tuner" or target.startswith("tuner."):
                found.append(Import(module, target, f"{where}:{node.lineno}"))
    return found


def collect(sources: Mapping[str, tuple[str, bool, str]]) -> tuple[list[Import], set[str]]:
    """sources: module -> (where, is_package, text). All their tuner imports, and the modules."""
    known = set(sources)
    found = []
    for module, (where, is_package, text) in sources.items():
        found += imports_of(module, is_package, ast.parse(text), where, known)
    return found, known


def tuner_sources() -> dict[str, tuple[str, bool, str]]:
    """Every module under tuner/ (the migrations link to db/ is not followed: db/ is Alembic's,
    above storage)."""
    sources = {}
    for folder, _, files in os.walk(TUNER):  # followlinks=False
        for name in files:
            if name.endswith(".py"):
                path = Path(folder) / name
                sources[module_name(path, REPO)] = (
                    str(path.relative_to(REPO)),
                    name == "__init__.py",
                    path.read_text(),
                )
    return sources


def layer_problems(found: Iterable[Import], modules: Iterable[str]) -> list[str]:
    """Modules LAYERS does not place, imports of a higher layer or of a sibling."""
    problems = [f"{m}: not in any layer of LAYERS" for m in sorted(modules) if not group_of(m)]
    for imp in found:
        source, target = group_of(imp.source), group_of(imp.target)
        if source is None or target is None or source[0] == target[0]:
            continue
        if target[1] > source[1]:
            problems.append(
                f"{imp.where}: {imp.source} ({source[0]}, rank {source[1]}) imports "
                f"{imp.target} ({target[0]}, rank {target[1]}): a lower layer imports a higher"
            )
        elif target[1] == source[1]:
            problems.append(
                f"{imp.where}: {imp.source} ({source[0]}) imports {imp.target} ({target[0]}): "
                f"siblings of rank {source[1]} never import each other"
            )
    return problems


def cycles(found: Iterable[Import], modules: Iterable[str]) -> list[str]:
    """One line per import cycle between modules (a strongly connected component of more than
    one module, or a module importing itself): a cycle through it, each edge with its file:line."""
    edges: dict[str, dict[str, str]] = defaultdict(dict)
    for imp in found:
        if imp.target in modules:
            edges[imp.source].setdefault(imp.target, imp.where)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm; the module graph is a few hundred deep
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            components.append(component)

    for node in sorted(modules):
        if node not in index:
            connect(node)
    found_cycles = []
    for component in components:
        members = set(component)
        start = min(component)
        if len(component) == 1 and start not in edges[start]:
            continue
        # The shortest way from start back to itself inside the component.
        paths = {start: [start]}
        queue = [start]
        cycle: list[str] = []
        while queue and not cycle:
            node = queue.pop(0)
            for nxt in sorted(edges[node]):
                if nxt == start:
                    cycle = [*paths[node], start]
                    break
                if nxt in members and nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    queue.append(nxt)
        steps = [f"{a} ({edges[a][b]}) -> {b}" for a, b in itertools.pairwise(cycle)]
        found_cycles.append(f"cycle of {len(component)} modules: " + "; ".join(steps))
    return found_cycles


def test_no_package_imports_upwards_or_sideways() -> None:
    found, modules = collect(tuner_sources())
    assert len(found) > 100  # the walk did find the package's imports
    problems = layer_problems(found, modules)
    assert not problems, "\n".join(problems)


def test_no_import_cycles_between_modules() -> None:
    found, modules = collect(tuner_sources())
    problems = cycles(found, modules)
    assert not problems, "\n".join(problems)


def test_the_package_imports_nothing_of_the_tests_or_benchmarks() -> None:
    """tests/lab, the tests' helpers and the benchmarks stand above the package: tuner never
    reaches them (they are not even installed with it)."""
    outside = {p.stem for folder in ("tests", "benchmarks") for p in (REPO / folder).glob("*.py")}
    outside |= {p.parent.name for p in (REPO / "tests").glob("*/__init__.py")}
    outside |= {"tests", "benchmarks"}
    assert "lab" in outside and "tunerproc" in outside
    problems = []
    for module, (where, _, text) in tuner_sources().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            problems += [
                f"{where}:{node.lineno}: {module} imports {name}"
                for name in names
                if name.partition(".")[0] in outside
            ]
    assert not problems, "\n".join(problems)


def synthetic(**texts: str) -> tuple[list[Import], set[str]]:
    """Modules made of source text, keyed by dotted name with '__' for '.'."""
    sources = {}
    for key, text in texts.items():
        module = key.replace("__", ".")
        sources[module] = (f"<{module}>", False, text)
    return collect(sources)


def test_the_checks_catch_an_upward_import_a_sibling_and_a_cycle() -> None:
    found, modules = synthetic(
        tuner__model__curves="import numpy\nfrom tuner.errors import ConfigError\n",
        tuner__errors="",
        tuner__storage__fits="from tuner.model import curves\n",
        tuner__twin__engine=(
            "def run():\n    from tuner.decide.tune import tune\n    from tuner.bench import x\n"
        ),
        tuner__decide__tune="from . import advice\n",
        tuner__decide__advice=(
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from tuner.decide.tune import tune\n"
        ),
        tuner__bench="",
        tuner__gadgets__x="",
    )
    problems = layer_problems(found, modules)
    assert problems == [
        "tuner.gadgets.x: not in any layer of LAYERS",
        "<tuner.twin.engine>:2: tuner.twin.engine (twin, rank 4) imports tuner.decide.tune "
        "(decide, rank 5): a lower layer imports a higher",
        "<tuner.twin.engine>:3: tuner.twin.engine (twin) imports tuner.bench (bench): "
        "siblings of rank 4 never import each other",
    ]
    assert cycles(found, modules) == [
        "cycle of 2 modules: tuner.decide.advice (<tuner.decide.advice>:3) -> tuner.decide.tune; "
        "tuner.decide.tune (<tuner.decide.tune>:1) -> tuner.decide.advice"
    ]
    # Downward imports and imports inside a layer are no problem; nor is an acyclic graph.
    ok_found, ok_modules = synthetic(
        tuner__model__curves="from tuner.errors import ConfigError\n",
        tuner__errors="",
        tuner__cli__app="from tuner.model import curves\nfrom tuner.cli import render\n",
        tuner__cli__render="from tuner import errors\n",
    )
    assert layer_problems(ok_found, ok_modules) == []
    assert cycles(ok_found, ok_modules) == []


def test_every_layer_names_modules_that_exist() -> None:
    """A prefix that matches no module is a stale entry (a renamed or removed package)."""
    modules = set(tuner_sources())
    stale = [
        prefix
        for _, _, prefixes in LAYERS
        for prefix in prefixes
        if not any(m == prefix or m.startswith(prefix + ".") for m in modules)
    ]
    assert not stale
