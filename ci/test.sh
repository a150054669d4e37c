#!/usr/bin/env bash
# The whole test suite, from a fresh machine with Python 3.10+ and pip:
#   bash ci/test.sh
# Makes its own virtual environment (.venv-ci, or $TFDET_VENV), installs tfdet
# with the CPU build of TensorFlow and the test tools, lints, and runs pytest
# (in parallel, pytest-xdist; extra arguments go to pytest, e.g. `-n 0` for
# one process).
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${TFDET_VENV:-.venv-ci}"
python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"

"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  -c ci/constraints.txt -e ".[cpu,test]"
# tf_keras declares a dependency on the full `tensorflow` distribution, which
# would install a second TensorFlow over tensorflow-cpu in the same directory;
# its only dependency is TensorFlow itself, so install it without deps.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-deps -c ci/constraints.txt tf_keras

"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
# One pytest worker per core, at most 4: each test may start several
# TensorFlow processes of its own (about 0.5 GB each).
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -n auto --maxprocesses 4 "$@"
