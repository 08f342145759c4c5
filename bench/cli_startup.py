"""How much a CLI call costs before it does anything: ``--help`` of both programs, as whole
processes, side by side.

Each command runs ``--runs`` times after one warm-up, interleaved (A B C A B C ...) so that
the machine's drift hits them alike; every run's CPU (user + system, from the kernel's
accounting of the reaped child) and wall time are kept. Printed: the median of each, and
each command's median CPU as a ratio to ``endpointd --help``'s, the daemon's CLI, which
has loaded lazily from the start.

    .venv/bin/python -m bench.cli_startup [--runs 15] [--json]

``SUPERAGENT_BENCH_PYTHONPATH`` puts another checkout first on the path (a worktree of an
older commit), to measure its ``superagent`` beside this one's in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

GOAL_CPU_SECONDS = 0.3  # issue "Front door", item 1

# The installed entry points, as people run them (beside this interpreter, in its venv).
BIN = os.path.dirname(sys.executable)
COMMANDS = {
    "endpointd --help": [os.path.join(BIN, "endpointd"), "--help"],
    "superagent --help": [os.path.join(BIN, "superagent"), "--help"],
    "superagent say --help": [os.path.join(BIN, "superagent"), "say", "--help"],
}


def run_once(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """CPU seconds (user + system) and wall seconds of one whole process."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tempfile.gettempdir(),  # not a checkout, whose folders could shadow the packages
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read() if proc.stderr else b""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}): {stderr.decode()}")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="counted runs of each command")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    env = dict(os.environ)
    extra = os.environ.get("SUPERAGENT_BENCH_PYTHONPATH")
    commands = dict(COMMANDS)
    if extra:
        for name in [n for n in COMMANDS if n.startswith("superagent")]:
            commands[f"{name} ({extra})"] = COMMANDS[name]
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    wall: dict[str, list[float]] = {name: [] for name in commands}
    for round_ in range(args.runs + 1):
        for name, argv in commands.items():
            run_env = dict(env)
            if extra and name.endswith(f"({extra})"):
                run_env["PYTHONPATH"] = extra
            used, took = run_once(argv, run_env)
            if round_:  # the first round warms the page cache
                cpu[name].append(used)
                wall[name].append(took)
    base = statistics.median(cpu["endpointd --help"])
    rows = {
        name: {
            "cpu_s": statistics.median(cpu[name]),
            "cpu_min_s": min(cpu[name]),
            "cpu_max_s": max(cpu[name]),
            "wall_s": statistics.median(wall[name]),
            "cpu_vs_endpointd": statistics.median(cpu[name]) / base,
        }
        for name in commands
    }
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{args.runs} runs each, interleaved; medians (CPU = user + system)\n")
    print("| command | CPU s | CPU min–max s | wall s | CPU ÷ `endpointd --help` |")
    print("|---|---|---|---|---|")
    for name, row in rows.items():
        print(
            f"| `{name}` | {row['cpu_s']:.3f} | {row['cpu_min_s']:.3f}–{row['cpu_max_s']:.3f} "
            f"| {row['wall_s']:.3f} | {row['cpu_vs_endpointd']:.2f}× |"
        )
    ours = [r for n, r in rows.items() if n.startswith("superagent") and "(" not in n]
    met = all(r["cpu_s"] <= GOAL_CPU_SECONDS for r in ours)
    verdict = "met" if met else "NOT met"
    print(f"\nGoal: each `superagent` help ≤ {GOAL_CPU_SECONDS} s of CPU: {verdict}")


if __name__ == "__main__":
    main()
