#!/usr/bin/env bash
# One training on two real machines: killed on one, resumed on the other.
#
#   bash benchmarks/two_machines.sh run OUT            # on each machine
#   bash benchmarks/two_machines.sh resume OTHER OUT   # OTHER: the other machine's OUT
#   bash benchmarks/two_machines.sh compare A B        # both machines' OUTs, on either
#
# `run` trains each case below uninterrupted (OUT/full-CASE.json: the final
# weights' digest) and again killed with SIGKILL halfway (OUT/killed-CASE/:
# the backup Keras's BackupAndRestore left), plus two controls that train
# without what makes the bits portable. `resume` resumes the other machine's
# backups here, in a fresh process (OUT/resumed-CASE.json). `compare` prints
# one row per case: a resume on the other machine is exact when its digest is
# the uninterrupted run's. The scripts are the test suite's resume scripts
# (tests/targets/scripts/); every process runs under PYTHONHASHSEED=0.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scripts=$root/tests/targets/scripts
python=${PYTHON:-python3}
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} PYTHONHASHSEED=0 TF_CPP_MIN_LOG_LEVEL=2

# CASE|script|arguments|kill point (epoch:batch); no kill point: a control.
cases=(
  "dense-array|resumable_fit.py|--data array --save-freq 3|1:5"
  "conv-tfdata|resumable_fit.py|--model conv --data tfdata --save-freq 3|1:5"
  "conv-pydataset|resumable_fit.py|--model conv --data pydataset --save-freq 1|2:3"
  "conv-every-core|resumable_fit.py|--model conv --pool-size-free --threads 0 --save-freq 3|1:5"
  "gan|resumable_gan.py|--save-freq 1|1:3"
  "control-conv-plain-tensorflow|resumable_fit.py|--model conv --plain --data tfdata|"
  "control-conv-every-core-without-pool-size-free|resumable_fit.py|--model conv --threads 0|"
)

field() { cut -d'|' -f"$2" <<<"$1"; }

run_case() {  # CASE-line OUT
  local name script args kill
  name=$(field "$1" 1) script=$scripts/$(field "$1" 2) args=$(field "$1" 3) kill=$(field "$1" 4)
  # shellcheck disable=SC2086
  "$python" "$script" "$2/full-$name.json" "$(mktemp -d)/backup" $args \
    2>"$2/full-$name.log"
  if [ -n "$kill" ]; then
    # shellcheck disable=SC2086
    if "$python" "$script" "$2/unused.json" "$2/killed-$name" $args --kill "$kill" \
      2>"$2/killed-$name.log"; then
      echo "$name: expected a SIGKILL at $kill; the run finished" >&2
      return 1
    fi
  fi
}

resume_case() {  # CASE-line OTHER OUT
  local name script args kill backup
  name=$(field "$1" 1) script=$scripts/$(field "$1" 2) args=$(field "$1" 3) kill=$(field "$1" 4)
  [ -n "$kill" ] || return 0
  backup=$(mktemp -d)/backup
  cp -r "$2/killed-$name" "$backup"  # Owned by this user, as a real copy is.
  # shellcheck disable=SC2086
  "$python" "$script" "$3/resumed-$name.json" "$backup" $args 2>"$3/resumed-$name.log"
}

case ${1:-} in
  run)
    out=$2
    mkdir -p "$out"
    "$python" -m tfdet env >"$out/env.txt" 2>&1 || true
    for line in "${cases[@]}"; do run_case "$line" "$out" & done
    wait
    ;;
  resume)
    other=$2 out=$3
    mkdir -p "$out"
    for line in "${cases[@]}"; do resume_case "$line" "$other" "$out" & done
    wait
    ;;
  compare)
    "$python" - "$2" "$3" "${cases[@]}" <<'EOF'
import json, os, sys

a, b, cases = sys.argv[1], sys.argv[2], sys.argv[3:]

def digest(folder, kind, name):
    path = os.path.join(folder, f"{kind}-{name}.json")
    if not os.path.exists(path):
        return "(none)"
    return json.load(open(path))["digest"]

def cpu(folder):
    facts = dict(
        line.split(": ", 1) for line in open(os.path.join(folder, "env.txt"))
        if ": " in line and not line.startswith(" ")
    )
    keys = ("cpu_vendor", "cpu_model", "cpu_family", "cpu_model_number",
            "cpu_caches", "cpu_count", "cpu_isa_best", "python", "tensorflow")
    return ", ".join(f"{k}={facts[k].strip()}" for k in keys if k in facts)

print(f"A: {cpu(a)}\nB: {cpu(b)}")
print(f"{'case':48s} {'A uninterrupted':17s} {'B uninterrupted':17s} "
      f"{'killed A, resumed B':20s} {'killed B, resumed A':20s}")
for line in cases:
    name, _, _, kill = line.split("|")
    row = [digest(a, "full", name), digest(b, "full", name)]
    if kill:
        row += [digest(b, "resumed", name), digest(a, "resumed", name)]
    if "(none)" in row:
        verdict = "incomplete"
    else:
        verdict = "same bits" if len(set(row)) == 1 else "DIFFERENT"
    print(f"{name:48s} " + " ".join(f"{d:17s}" for d in row) + f"  {verdict}")
EOF
    ;;
  *)
    sed -n '2,8p' "$0" >&2
    exit 2
    ;;
esac
