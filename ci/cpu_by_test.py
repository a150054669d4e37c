"""Where a test run's CPU goes: per test, per test file, per kind of process.

    python3 ci/cpu_by_test.py [--every S] [--top N] [--json FILE] -- COMMAND...

runs COMMAND (e.g. `.venv-ci/bin/python -m pytest -n 2 -q`) and, every S
seconds until it ends, reads the CPU time of every process on the machine
from /proc. pytest sets `PYTEST_CURRENT_TEST` in its own environment while
a test runs, and every process a test starts inherits it (its TensorFlow
children, the runs of a `tfdet check` and their CPU-burning neighbour), so
each process's CPU is charged to the test that was running when it was
started. Processes without it (the pytest controller, collection, anything
else on the machine) are charged to "(no test)".

pytest's own `--durations` gives wall time; on a machine whose cores are all
busy, a test's wall time also counts the other worker's load, so CPU time
is what a change to the suite saves. A process's CPU after the last read
before it ended is not seen (at most `--every` seconds of it). Linux only
(/proc).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
NO_TEST = "(no test)"
NEIGHBOUR_MARK = b"cpu-burning neighbour"


def _processes() -> dict[int, tuple[int, str, str]]:
    """pid -> (CPU ticks so far, its test, its kind) for every process."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes()
            command = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:  # Ended meanwhile, or not ours to read.
            continue
        # The fields after the command name, which may hold spaces.
        fields = stat.rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime + stime
        test = NO_TEST
        for variable in environ.split(b"\0"):
            if variable.startswith(b"PYTEST_CURRENT_TEST="):
                # "tests/x.py::test_y[param] (call)": the phase dropped.
                value = variable.split(b"=", 1)[1].decode(errors="replace")
                test = value.rsplit(" (", 1)[0]
        kind = "neighbour" if NEIGHBOUR_MARK in argv else command or "?"
        found[int(entry)] = (ticks, test, kind)
    return found


def _machine_ticks() -> list[int]:
    """The machine's CPU ticks so far, all cores: user, nice, system, idle,
    iowait, irq, softirq, steal (/proc/stat's first line)."""
    return [int(n) for n in Path("/proc/stat").read_text().split()[1:9]]


def measure(command: list[str], every: float) -> tuple[int, dict]:
    """Runs `command`; its exit status and the CPU seconds it used, by
    test, by test file, by kind of process, and the machine's busy and idle
    seconds (all cores) over the run."""
    by_test: collections.Counter[str] = collections.Counter()
    by_kind: collections.Counter[str] = collections.Counter()
    seen = _processes()
    machine_before = _machine_ticks()
    process = subprocess.Popen(command)
    while True:
        ended = process.poll() is not None
        now = _processes()
        for pid, (ticks, test, kind) in now.items():
            before = seen.get(pid)
            # A pid seen before with more ticks was reused by a new process.
            used = ticks - before[0] if before and before[0] <= ticks else ticks
            if used > 0:
                by_test[test] += used
                by_kind[kind] += used
        seen = now
        if ended:
            break
        time.sleep(every)
    spent = [b - a for a, b in zip(machine_before, _machine_ticks(), strict=True)]
    idle = spent[3] + spent[4]  # idle + iowait
    by_file: collections.Counter[str] = collections.Counter()
    for test, ticks in by_test.items():
        by_file[test.split("::")[0]] += ticks
    seconds = {
        "machine": {"busy": (sum(spent) - idle) / TICKS, "idle": idle / TICKS},
        "by_kind": {k: v / TICKS for k, v in by_kind.most_common()},
        "by_file": {k: v / TICKS for k, v in by_file.most_common()},
        "by_test": {k: v / TICKS for k, v in by_test.most_common()},
    }
    return process.returncode, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--every", type=float, default=0.5, help="Seconds between reads."
    )
    parser.add_argument("--top", type=int, default=30, help="Tests and files listed.")
    parser.add_argument("--json", type=Path, help="Also write every figure here.")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    code, seconds = measure(command, args.every)
    if args.json:
        args.json.write_text(json.dumps(seconds, indent=1) + "\n")
    machine = seconds["machine"]
    print(
        f"\nCPU seconds (all cores): {machine['busy']:.0f} busy, "
        f"{machine['idle']:.0f} idle; a process is charged to the test that "
        "started it"
    )
    for title in ("by_kind", "by_file", "by_test"):
        print(f"{title.replace('_', ' ')}:")
        for name, value in list(seconds[title].items())[: args.top]:
            print(f"  {value:8.1f}  {name}")
    return code


if __name__ == "__main__":
    sys.exit(main())
