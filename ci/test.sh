#!/usr/bin/env bash
# The whole test suite, from a fresh machine with Python 3.10+ and pip:
#   bash ci/test.sh
# Makes its own virtual environment (.venv-ci, or $TFDET_VENV), installs tfdet
# with the CPU build of TensorFlow and the test tools, lints, and runs pytest
# (in parallel, pytest-xdist; extra arguments go to pytest, e.g. `-n 0` for
# one process); beside it, at a lower priority, CI's parts of the smoke set on
# the oldest TensorFlow and Keras tfdet supports and on an emulated aarch64,
# each in a virtual environment of its own (ci/matrix.py --oldest, --aarch64).
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${TFDET_VENV:-.venv-ci}"
python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"

"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  -c ci/constraints.txt -e ".[cpu,test]"
# The checkout's modules compiled once: where PYTHONDONTWRITEBYTECODE is set
# (as on the machines this suite runs on), no process writes its .pyc, and
# each of the suite's ~1,300 Python processes compiled tfdet from source
# again (0.2 s of CPU a `tfdet` command, 124 modules; compileall writes
# them whatever that variable says).
"$venv/bin/python" -m compileall -q tfdet tests benchmarks examples >/dev/null
# tfdet's C++ kernels, built once per TensorFlow version for every test
# process (and kept with the environment), here rather than in the user's
# cache; built now, as soon as TensorFlow is there, while the rest installs
# and the linters and the documentation run.
venv_path="$(cd "$venv" && pwd)"
export TFDET_KERNEL_CACHE="${TFDET_KERNEL_CACHE:-$venv_path/tfdet-kernels}"
# The matrix parts' environments (below) go inside the test environment too,
# not into the checkout: each run of a `check --script` gets a mirror of its
# working directory, here the checkout, with its small files copied (all but
# virtual environments, which are linked whole). The emulated aarch64
# environment's Debian root there (about 4,200 small files) took 4 s of CPU a
# run to copy and doubled a script check's wall time (24.5-29.1 s against
# 13.4-14.4 s, 2-core EPYC Zen 3).
export TFDET_MATRIX_VENVS="${TFDET_MATRIX_VENVS:-$venv_path/matrix}"
"$venv/bin/python" ci/prebuild_kernels.py &
kernels=$!
# tf_keras declares a dependency on the full `tensorflow` distribution, which
# would install a second TensorFlow over tensorflow-cpu in the same directory;
# its only dependency is TensorFlow itself, so install it without deps.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-deps -c ci/constraints.txt tf_keras

# matplotlib, for the --plot tests (they draw in pytest's own process), goes
# into a directory of its own that tests/conftest.py appends to pytest's
# sys.path: installed in the virtual environment, it would be imported by every
# TensorFlow process the tests spawn (TensorFlow imports Keras, and Keras
# imports matplotlib.pyplot whenever it can): about 1 s a process on a 2-core
# EPYC Zen 3, on about 900 processes.
[ -d "$venv/plot-only/matplotlib" ] || "$venv/bin/python" -m pip install --quiet \
  --disable-pip-version-check -c ci/constraints.txt --target "$venv/plot-only" matplotlib

# QEMU's user-mode emulator: the emulated-CPU tests run a process on another
# vendor's x86 CPU model and on aarch64; Debian's aarch64 cross compiler
# builds tfdet's kernels into the emulated aarch64 environment's wheel (as a
# source install on an ARM machine builds them). Installed where this can
# (root with apt-get); elsewhere those tests skip and pytest's summary says why.
packages=()
command -v qemu-x86_64 >/dev/null 2>&1 || packages+=(qemu-user)
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || packages+=(g++-aarch64-linux-gnu)
if [ "${#packages[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1 \
  && [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}" >/dev/null 2>&1; } \
    || echo "ci/test.sh: ${packages[*]} could not be installed; emulated-CPU tests will skip"
fi

"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
# The type checker over the packages [tool.mypy] lists (pyproject.toml).
"$venv/bin/mypy"
# The documentation site (docs/, mkdocs.yml): --strict fails on a page missing
# from the nav or a link to a missing page or heading.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check mkdocs
"$venv/bin/mkdocs" build --strict --site-dir "$(mktemp -d)"
# The matrix parts run beside pytest, one after the other (each installs this
# checkout, and two setuptools builds in one tree collide): each environment
# is made at the lowest priority (the downloads, the unpacking, the writes),
# each part's tests run at a low one. So they fill what pytest leaves of the
# cores (its tests wait on sleeping runs and timeouts), and what is left of
# them runs after it.
# - The oldest TensorFlow and Keras tfdet supports, in a virtual environment
#   of its own (under $TFDET_MATRIX_VENVS): CI's part of the smoke set
#   (ci/smoke.txt, the lines marked `ci`). The whole smoke set in every
#   combination: `python3 ci/matrix.py` (docs/reference/compatibility.md).
# - Linux aarch64: TensorFlow's aarch64 wheel in an aarch64 Python that QEMU's
#   user-mode emulator runs here (ci/aarch64.py; an emulation, not an ARM
#   CPU), the smoke lines marked `aarch64`: about 3 minutes alone on a 2-core
#   EPYC Zen 3. Where there is no qemu-aarch64 or apt, it says so and skips.
# A build that fails is made again, and said, by its part.
matrix_part() {  # PART FLAGS...: makes the combination, then runs the part.
  local part="$1"
  shift
  nice -n 19 "$python" ci/matrix.py "$@" --build-only || true
  nice -n 10 "$python" ci/matrix.py "$@" --part "$part" --no-record
}
matrix_log="$(mktemp)"
{
  parts=0
  matrix_part ci --oldest || parts=1
  matrix_part aarch64 --aarch64 || parts=1
  exit "$parts"
} >"$matrix_log" 2>&1 &
matrix=$!
wait "$kernels" || true  # Said above; the tests build again, or fall back.
# One pytest worker per core, at most 4: each test may start several
# TensorFlow processes of its own (about 0.5 GB each). The 30 slowest tests are
# listed in every log: they hold the suite's time (pytest 33-45 minutes on a
# 2-core EPYC Zen 3 VM whose speed varied; docs/measurements.md, "Test suite").
# `--dist loadgroup`: the tests that share a module-scoped fixture go to one
# worker (tests/conftest.py groups them), so the fixture runs once.
status=0
"$venv/bin/python" -m pytest -q -p no:cacheprovider -n auto --maxprocesses 4 \
  --dist loadgroup --durations=30 "$@" || status=$?
wait "$matrix" || status=1
cat "$matrix_log"
exit "$status"
