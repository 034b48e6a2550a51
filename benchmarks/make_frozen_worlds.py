"""Write the frozen set of twin worlds (tests/lab/frozen.py) into profiles/twin/frozen/, or check
that the committed files are what the generator makes.

    .venv/bin/python benchmarks/make_frozen_worlds.py            # write
    .venv/bin/python benchmarks/make_frozen_worlds.py --check    # compare, exit 1 on a change

The set is frozen: a world is never adjusted after seeing how the tuner does on it. Changing the
generator makes a new set (raise lab.frozen.GENERATOR_VERSION), graded from scratch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import common  # noqa: F401  (puts tests/ on sys.path: lab)
from lab.frozen import GENERATOR_SEED, WORLD_COUNT, generate, render_set

FROZEN = Path(__file__).resolve().parent.parent / "profiles" / "twin" / "frozen"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FROZEN, help="folder (default %(default)s)")
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    files = render_set(generate(WORLD_COUNT, GENERATOR_SEED), GENERATOR_SEED)
    if args.check:
        changed = [
            name
            for name, text in files.items()
            if not (args.out / name).exists() or (args.out / name).read_text() != text
        ]
        extra = (
            sorted(p.name for p in args.out.glob("*.toml") if p.name not in files)
            if args.out.exists()
            else []
        )
        for name in changed:
            print(f"differs from the generator: {args.out / name}")
        for name in extra:
            print(f"not made by the generator: {args.out / name}")
        return 1 if changed or extra else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.out / name).write_text(text)
    print(f"wrote {len(files) - 1} worlds and the manifest into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
