"""What wtune's sandbox adds to Ray Tune's own cost, measured in one run on
one machine: per-trial overhead and result throughput of
`wtune.ray.WasmTrainable` (a guest that does no work) against a plain
Python class trainable that does no work, and the time and bytes of one
host-snapshot checkpoint through Ray's storage.

    python python/bench/ray_overhead.py [--trials 64] [--results 2000]

Prints a Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402
from ray import tune  # noqa: E402

import wtune.ray  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GUESTS = REPO / "target" / "wasm32-wasip2" / "release"


class Plain(tune.Trainable):
    """Ray's own cost: a trainable that reports and does nothing else."""

    def setup(self, config):
        self.n = 0

    def step(self):
        self.n += 1
        return {"score": float(self.n), "done": self.n >= self.config["iterations"]}

    def reset_config(self, new_config):
        self.n = 0
        return True

    def save_checkpoint(self, checkpoint_dir):
        Path(checkpoint_dir, "n").write_text(str(self.n))

    def load_checkpoint(self, checkpoint_dir):
        self.n = int(Path(checkpoint_dir, "n").read_text())


def fit(trainable, param_space, storage, reuse_actors=True, **run) -> float:
    started = time.perf_counter()
    grid = tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(max_concurrent_trials=2, reuse_actors=reuse_actors),
        run_config=tune.RunConfig(storage_path=storage, verbose=0, **run),
    ).fit()
    elapsed = time.perf_counter() - started
    assert not grid.errors, [r.error for r in grid]
    return elapsed


def best_of(repeats: int, measure) -> float:
    return min(measure() for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--results", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--snapshot-mib", type=int, default=64)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    scratch = tempfile.mkdtemp(prefix="wtune-ray-bench-")
    hostile = wtune.ray.trainable(GUESTS / "hostile.wasm", resources={"cpu": 1})
    plain = tune.with_resources(Plain, {"cpu": 1})
    rows = []
    try:
        # Per trial: many one-iteration trials (start, one result, stop),
        # on reused actors, and on a fresh actor (a new process) each.
        one = {"iterations": 1, "seed": tune.grid_search(list(range(args.trials)))}
        for name, trainable in (("plain Python", plain), ("wtune WasmTrainable", hostile)):
            seconds = best_of(args.repeats, lambda: fit(trainable, one, scratch))
            rows.append((name, "per trial (1 result), reuse_actors", seconds / args.trials * 1e3, "ms"))
        fresh_trials = max(args.trials // 4, 2)
        fresh = {"iterations": 1, "seed": tune.grid_search(list(range(fresh_trials)))}
        for name, trainable in (("plain Python", plain), ("wtune WasmTrainable", hostile)):
            seconds = best_of(args.repeats, lambda: fit(trainable, fresh, scratch, reuse_actors=False))
            rows.append((name, "per trial (1 result), a new actor each", seconds / fresh_trials * 1e3, "ms"))
        # Results: two long trials.
        many = {"iterations": args.results // 2, "seed": tune.grid_search([0, 1])}
        for name, trainable in (("plain Python", plain), ("wtune WasmTrainable", hostile)):
            seconds = best_of(args.repeats, lambda: fit(trainable, many, scratch))
            rows.append((name, "results/s (2 trials)", args.results / seconds, "/s"))
        # One host snapshot of a guest holding --snapshot-mib of state,
        # checkpointed every iteration vs never.
        stateful = wtune.ray.trainable(
            GUESTS / "stateful.wasm", limits={"memory": f"{2 * args.snapshot_mib + 64}MiB"},
            resources={"cpu": 1},
        )
        space = {"seed": 1, "buffer_kib": args.snapshot_mib * 1024, "iterations": 10}
        stop = {"training_iteration": 10}
        never = best_of(args.repeats, lambda: fit(stateful, space, scratch, stop=stop))
        every = best_of(args.repeats, lambda: fit(
            stateful, space, scratch, stop=stop,
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1, num_to_keep=2),
        ))
        checkpoint = next(Path(scratch).rglob(wtune.ray.CHECKPOINT_FILE))
        rows.append(("wtune WasmTrainable", f"checkpoint of {args.snapshot_mib} MiB guest state",
                     (every - never) / 10 * 1e3, "ms"))
        rows.append(("wtune WasmTrainable", "checkpoint file", checkpoint.stat().st_size / 2**20, "MiB"))
    finally:
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"Ray {ray.__version__}, wtune {wtune.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, best of {args.repeats}")
    print()
    print("| trainable | measure | value |")
    print("| --- | --- | --- |")
    for name, what, value, unit in rows:
        print(f"| {name} | {what} | {value:.2f} {unit} |")
    share = lambda plain, wasm: f"{100 * (wasm / plain - 1):+.1f}%"  # noqa: E731
    print()
    print(f"sandbox's share: per trial {share(rows[0][2], rows[1][2])} (reused actors), "
          f"{share(rows[2][2], rows[3][2])} (new actors); "
          f"per result {share(1 / rows[4][2], 1 / rows[5][2])}")


if __name__ == "__main__":
    main()
