"""Benchmark: the longest functions in tuner/, and how many are longer than a limit.

A function's length is its lines from `def` to its last line (signature and docstring included,
decorators not); a nested function counts in its own row and in its parent's. It reports and
does not judge: the exit status is 0 whatever it finds.

    .venv/bin/python benchmarks/function_lengths.py [--limit 80] [--top 20] [--root tuner]
        [--no-record]
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from record import Table, record_arguments, save_run

REPO = Path(__file__).resolve().parent.parent


def function_lengths(root: Path) -> list[tuple[int, str, str]]:
    """(lines, "file:line", qualified name) for every function under root, longest first."""
    rows: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, path: Path, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                rows.append((length, f"{path}:{child.lineno}", name))
                visit(child, path, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, path, prefix + child.name + ".")
            else:
                visit(child, path, prefix)

    for path in sorted(root.rglob("*.py")):
        visit(ast.parse(path.read_text()), path.relative_to(root.parent), "")
    rows.sort(key=lambda row: (-row[0], row[1]))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=80, help="count functions longer than this")
    parser.add_argument("--top", type=int, default=20, help="how many of the longest to print")
    parser.add_argument("--root", default=str(REPO / "tuner"), help="the package to walk")
    record_arguments(parser)
    args = parser.parse_args()
    rows = function_lengths(Path(args.root).resolve())
    for length, where, name in rows[: args.top]:
        print(f"{length:5d}  {where}  {name}")
    summary, tables = figures(rows, args.limit, args.top)
    print(
        f"{summary['over_limit']} of {summary['functions']} functions are longer than "
        f"{args.limit} lines"
    )
    save_run(__file__, args, summary, tables)
    return 0


def figures(
    rows: list[tuple[int, str, str]], limit: int, top: int
) -> tuple[dict[str, int], list[Table]]:
    """The run's headline figures and its table of the longest functions."""
    summary = {
        "functions": len(rows),
        "over_limit": sum(1 for length, _, _ in rows if length > limit),
        "limit": limit,
        "longest": rows[0][0] if rows else 0,
    }
    table = Table(
        f"the {top} longest functions",
        ["lines", "where", "function"],
        [list(r) for r in rows[:top]],
    )
    return summary, [table]


if __name__ == "__main__":
    raise SystemExit(main())
