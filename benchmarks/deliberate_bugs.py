"""Do the twin-based decision tests catch real mistakes on their own? (issue 26)

Four deliberate bugs, each put into a copy of the package in turn:

- tie reversed: tune's tie rule takes the largest N of a tie (settle: max(tie), not min);
- weights ignored: the tps objective weighs every concurrency alike, whatever the traffic;
- "at least N": the cost model's policy stops drafting once N slots generate (the patch stops
  only while more than N do);
- one standard error: pruning and one-sided bounds use one standard error instead of the
  t-quantile for the degrees of freedom taken.

For each, only the decision tests run (tests/test_decisions.py and tests/test_bench_twin.py:
the tuner's methods against twin worlds whose truth is known), every unit test of the function
set aside; the script prints which of them failed. A bug no decision test catches is a hole in
them. The copy runs from a temporary folder; the checkout is not touched.

    .venv/bin/python benchmarks/deliberate_bugs.py [--bug NAME] [--workers 2]

About 2 minutes a bug on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import Table, record_arguments, save_run

REPO = Path(__file__).resolve().parent.parent
DECISION_TESTS = ["tests/test_decisions.py", "tests/test_bench_twin.py"]

# name -> (file, the text as it is, the text with the bug)
BUGS: dict[str, tuple[str, str, str]] = {
    "tie-reversed": (
        "tuner/decide/settle.py",
        "    if min(tie) != answer:\n",
        "    if max(tie) != answer:\n",
    ),
    "weights-ignored": (
        "tuner/decide/search.py",
        "    w = np.zeros(n_parallel)\n    if not weights:\n",
        "    w = np.zeros(n_parallel)\n    if True:  # the bug: the traffic's weights ignored\n",
    ),
    "at-least-n": (
        "tuner/policy.py",
        "return self.max_slots == 0 or streams <= self.max_slots",
        "return self.max_slots == 0 or streams < self.max_slots",
    ),
    "one-standard-error": (
        "tuner/decide/paired.py",
        "half = t_quantile(confidence, self.df) * self.se",
        "half = 1.0 * self.se",
    ),
}
# tie-reversed changes two lines: the tie's answer is taken where it is returned, too
EXTRA = {
    "tie-reversed": [("return Standing(min(tie), MOVED,", "return Standing(max(tie), MOVED,")],
}


def copy_with_bug(name: str, into: Path) -> None:
    shutil.copytree(
        REPO,
        into,
        ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "out"),
    )
    path, before, after = BUGS[name]
    target = into / path
    text = target.read_text()
    if text.count(before) != 1:
        raise SystemExit(f"{name}: {path} no longer holds {before.strip()!r} once; update BUGS")
    text = text.replace(before, after)
    for old, new in EXTRA.get(name, []):
        if old not in text:
            raise SystemExit(f"{name}: {path} no longer holds {old!r}; update EXTRA")
        text = text.replace(old, new)
    target.write_text(text)


def run_decision_tests(root: Path, workers: int) -> tuple[list[str], int, float]:
    """The failed decision tests' ids, the number that ran, seconds."""
    env = {**os.environ, "PYTHONPATH": str(root)}  # the copy's package, not the checkout's
    started = time.perf_counter()
    pytest = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [*pytest, "-n", str(workers), *DECISION_TESTS],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    failed = re.findall(r"^FAILED (\S+)", result.stdout, re.MULTILINE)
    counts = re.findall(r"(\d+) (?:passed|failed)", result.stdout)
    if result.returncode not in (0, 1):
        raise SystemExit(f"pytest could not run the decision tests:\n{result.stdout[-3000:]}")
    return failed, sum(map(int, counts)), seconds


BUG_COLUMNS = ["bug", "caught", "failed tests", "decision tests", "seconds", "failed"]


def bug_row(name: str, failed: list[str], ran: int, seconds: float) -> list:
    """One bug's row: whether a decision test caught it, how many of how many, which."""
    return [name, bool(failed), len(failed), ran, seconds, [t.split("::")[-1] for t in failed]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bug", choices=sorted(BUGS), action="append")
    parser.add_argument("--workers", type=int, default=2)
    record_arguments(parser)
    args = parser.parse_args()
    names = args.bug or list(BUGS)
    caught_all = True
    rows: list[list] = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"tuner-bug-{name}-") as tmp:
            root = Path(tmp) / "repo"
            copy_with_bug(name, root)
            failed, ran, seconds = run_decision_tests(root, args.workers)
        verdict = "caught" if failed else "NOT CAUGHT"
        caught_all &= bool(failed)
        print(f"{name}: {verdict} by {len(failed)} of {ran} decision tests ({seconds:.0f} s)")
        for test in failed:
            print(f"    {test}")
        rows.append(bug_row(name, failed, ran, seconds))
    print("every bug caught" if caught_all else "a bug went uncaught: the decision tests miss it")
    save_run(
        __file__,
        args,
        {"every bug caught": caught_all, "workers": args.workers},
        [Table("the decision tests against each bug", BUG_COLUMNS, rows)],
    )


if __name__ == "__main__":
    main()
