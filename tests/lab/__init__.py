"""The tuner's lab: what runs the tuner's methods over twin worlds and known traffic, for the
tests and the benchmarks. It sits above every package of `tuner` (it drives decide, measure and
the twin together), so it lives outside it: nothing in `tuner` may import it.

- `method`: the tuner's methods (full, model, naive) run against a twin world, in-process and in
  virtual time (what tests/test_decisions.py and benchmarks/twin_regret.py grade);
- `frozen`: the frozen set of twin worlds those methods are graded on (profiles/twin/frozen/,
  written by benchmarks/make_frozen_worlds.py);
- `traffic`: known traffic offered to a plain bench llama-server, to check `tuner observe` and
  `tuner watch` against the truth;
- `openworlds`: the open-loop set of twin worlds and their traffic (profiles/twin/openloop/,
  written by benchmarks/make_openloop_worlds.py); `openmethod`: the tuner's methods for
  open-loop traffic run against them (closed, naive, and the slot of the open-loop method),
  graded by benchmarks/openloop_regret.py.

Imported as `lab.method` etc.: pytest puts tests/ on sys.path (rootdir conftest), and
benchmarks/common.py does the same for the benchmarks.
"""
