"""``python -m wtune.ray run MODEL --config FILE [--address ADDR]``: a
``wtune run`` experiment file on a Ray cluster."""

from __future__ import annotations

import argparse
import sys
import time

from .. import WtuneError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wtune.ray",
        description="Run a wtune experiment on Ray Tune: trials are placed on the cluster's "
        "nodes, each in wtune's sandbox.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run MODEL with an experiment file")
    run.add_argument("model", help="the trainable component (.wasm)")
    run.add_argument("--config", help="the experiment file (experiment.toml)")
    run.add_argument(
        "--address",
        help="the Ray cluster to join (\"auto\": the one on this machine); default: start "
        "a local Ray instance",
    )
    run.add_argument(
        "--storage-path",
        help="where Ray writes the experiment (default: the experiment's output_dir)",
    )
    args = parser.parse_args(argv)

    import ray

    from .experiment import summary, tuner

    try:
        ray.init(address=args.address, log_to_driver=False)
        experiment = tuner(args.model, args.config, storage_path=args.storage_path)
        for note in experiment.notes:
            print(f"note: {note}", file=sys.stderr)
        started = time.monotonic()
        grid = experiment.tuner.fit()
        print(summary(experiment, grid, time.monotonic() - started))
    except WtuneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
