#!/usr/bin/env python3
"""Instructions per bench run, from a callgrind profile split at each run.

`wtune-bench` times each run of a row between two calls of
`wtune_bench::experiment::cpu_time`. Run it under callgrind with a dump
before each call:

    valgrind --tool=callgrind --dump-before='wtune_bench::experiment::cpu_time' \
        --callgrind-out-file=DIR/cg.out target/release/wtune-bench throughput

and part 2k of the dumps holds run k's instructions (all threads), from
its first `cpu_time` call to its second. Rows run round robin, so with R
rows, run k belongs to row k mod R.

Usage: rows.py DIR ROWS [NAME...]  prints each row's instructions per run,
their median, and the median per result when --results N is given.
"""
import argparse
import pathlib
import statistics


def total(path):
    for line in path.open(errors="replace"):
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise SystemExit(f"{path}: no totals line")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=pathlib.Path)
    parser.add_argument("rows", type=int)
    parser.add_argument("names", nargs="*")
    parser.add_argument("--results", type=int, default=0, help="results (or trials) per run")
    args = parser.parse_args()
    runs = []
    part = 2
    while (args.dir / f"cg.out.{part}").exists():
        runs.append(total(args.dir / f"cg.out.{part}"))
        part += 2
    if len(runs) % args.rows:
        raise SystemExit(f"{len(runs)} runs do not split into {args.rows} rows")
    for row in range(args.rows):
        counts = runs[row :: args.rows]
        name = args.names[row] if row < len(args.names) else f"row {row + 1}"
        median = statistics.median(counts)
        per = f", {median / args.results:,.0f} per result" if args.results else ""
        each = ", ".join(f"{c / 1e6:,.0f}M" for c in counts)
        print(f"{name}: median {median / 1e6:,.1f}M{per} (runs: {each})")


if __name__ == "__main__":
    main()
