#!/usr/bin/env bash
# The virtualenv half of scripts/setup.sh: .venv with tuner (editable) and its test tools, no
# bench; all that scripts/test.sh --fast needs. Safe to rerun: pip runs again only when
# pyproject.toml changed since the last install that succeeded (the package itself is editable,
# so changed sources need no reinstall).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.tuner-installed
wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    rm -f "$stamp"
    pip_ok=true
    # uv installs the same packages in about 11 s where pip took 44 s on 2 cores (bytecode
    # compiled either way: PYTHONDONTWRITEBYTECODE, set on these machines, would otherwise make
    # every process compile what it imports). pip does it where uv cannot be had or fails.
    if .venv/bin/pip install --quiet --disable-pip-version-check uv > .venv/pip.log 2>&1 \
        && .venv/bin/uv pip install --quiet --python .venv/bin/python --compile-bytecode \
            -e '.[test]' >> .venv/pip.log 2>&1; then
        :
    else
        echo "setup: uv could not install the packages; installing them with pip" >&2
        .venv/bin/pip install --quiet --disable-pip-version-check -e '.[test]' \
            >> .venv/pip.log 2>&1 || pip_ok=false
    fi
    grep -v "is ignored: it is neither a file nor a directory" .venv/pip.log || true
    .venv/bin/python -c "import tuner, optuna, sqlalchemy, scipy" \
        || { echo "setup: the virtualenv is incomplete (pip install failed?)" >&2; exit 1; }
    # Only a complete install is remembered: after a failed one, the next run tries again.
    if $pip_ok; then
        echo "$wanted" > "$stamp"
    fi
fi
# The package is installed editable, so its own modules are compiled here, not by the install:
# with PYTHONDONTWRITEBYTECODE set (as on these machines) every `tuner` process would otherwise
# compile what it imports afresh (about 0.3 s a process; the test suite starts hundreds).
# Python reads these files whatever that variable says and skips any older than its source.
.venv/bin/python -m compileall -q tuner > /dev/null
echo "setup: .venv/bin/tuner is ready (\`. .venv/bin/activate\` puts tuner on PATH)" >&2
