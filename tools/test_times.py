"""``python -m tools.test_times TIME_MAP.json [--top N]``: where a test run's time went, as the tables docs/testing.md
keeps ("Where the time goes"), from the JSON that ``pytest --time-map PATH`` writes (tests/timebudget.py).

It prints the tiers (tests, seconds in the tests and in their wide fixtures), the slowest tests with their setup,
call and teardown apart, the slowest wide fixtures (a module's or the session's shared job, timed apart from the
tests that use it), and the seconds per test file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def tables(m: dict, top: int = 20) -> str:
    out = []
    tiers = m["tiers"]
    out.append("| tier | tests | in the tests (s) | in their wide fixtures (s) | together (s) |")
    out.append("|---|---:|---:|---:|---:|")
    for name in ("fast", "slow"):
        t = tiers[name]
        out.append(
            f"| {name} | {t['tests']} | {t['test_seconds']:.0f} | {t['fixture_seconds']:.0f} | {t['seconds']:.0f} |"
        )
    workers = f" on {m['workers']} workers" if m.get("workers") else " in one process"
    out.append(f"\nThe run's wall clock: {m['wall_seconds']:.0f} s{workers} (host factor {m['host_factor']:.2f}).\n")

    tests = sorted(m["tests"].items(), key=lambda kv: -kv[1]["own"])[:top]
    out.append(
        f"**The {len(tests)} slowest tests** (their own seconds: setup, call and teardown, less wide fixtures):\n"
    )
    out.append("| test | tier | setup | call | teardown | own (s) | budget (s) |")
    out.append("|---|---|---:|---:|---:|---:|---:|")
    for name, t in tests:
        p = t["phases"]
        out.append(
            f"| `{name}` | {'slow' if t['slow'] else 'fast'} | {p.get('setup', 0):.1f} | {p.get('call', 0):.1f} "
            f"| {p.get('teardown', 0):.1f} | {t['own']:.1f} | {t.get('budget', 20):g} |"
        )
    fixtures = sorted(m["fixtures"].items(), key=lambda kv: -kv[1]["seconds"])[:top]
    out.append(f"\n**The {len(fixtures)} slowest wide fixtures** (their own setup, timed apart from the tests):\n")
    out.append("| fixture | scope | seconds | budget (s) |")
    out.append("|---|---|---:|---:|")
    for name, x in fixtures:
        out.append(f"| `{name}` | {x['scope']} | {x['seconds']:.1f} | {x.get('budget', 20):g} |")
    per_file: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for name, t in m["tests"].items():
        f = per_file[name.split("::")[0]]
        f[0] += 1
        f[1] += t["own"]
    for x in m["fixtures"].values():
        if x["first_test"]:
            per_file[x["first_test"].split("::")[0]][1] += x["seconds"]
    files = sorted(per_file.items(), key=lambda kv: -kv[1][1])[:top]
    out.append(f"\n**The {len(files)} slowest test files** (their tests and the wide fixtures they set up):\n")
    out.append("| file | tests | seconds |")
    out.append("|---|---:|---:|")
    for name, (n, s) in files:
        out.append(f"| `{name}` | {n} | {s:.0f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.test_times", description=__doc__.split("\n\n")[0])
    ap.add_argument("time_map", type=Path, help="the JSON written by pytest --time-map PATH")
    ap.add_argument("--top", type=int, default=20, help="rows in each table of the slowest (default 20)")
    args = ap.parse_args(argv)
    try:
        m = json.loads(args.time_map.read_text())
    except (OSError, ValueError) as e:
        print(f"error: {args.time_map}: not a time map ({e}); write one with pytest --time-map PATH", file=sys.stderr)
        return 2
    sys.stdout.write(tables(m, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
