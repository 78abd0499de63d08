"""Shared fixtures: the guest components scripts/setup.sh builds, and a
compile cache of the test session's own, so that every component is
compiled once here, by the compile worker the package runs through Python."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUESTS = REPO / "target" / "wasm32-wasip2" / "release"
DIGITS = REPO / "examples" / "digits-mlp"

# Before wtune is imported anywhere (and inherited by Ray's workers).
os.environ.setdefault("WTUNE_CACHE_DIR", tempfile.mkdtemp(prefix="wtune-pytest-cache-"))
# This machine's network is closed; Ray must not try to report usage.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def guest(name: str) -> Path:
    path = GUESTS / f"{name}.wasm"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run scripts/setup.sh to build the guest components")
    return path


@pytest.fixture(scope="session")
def stateful() -> Path:
    return guest("stateful")


@pytest.fixture(scope="session")
def hostile() -> Path:
    return guest("hostile")


@pytest.fixture(scope="session")
def digits() -> Path:
    return guest("digits_mlp")


#: digits-mlp's shipped configuration, with its math metered in the sandbox
#: (no host compute), so results are the same bits in every process.
DIGITS_CONFIG = {
    "lr": 0.1,
    "hidden": 32,
    "batch_size": 64,
    "momentum": 0.8,
    "weight_decay": 1e-4,
    "math": "wasm",
}


@pytest.fixture(scope="session")
def cluster():
    """A real Ray cluster on this machine: a head with no CPUs and two worker
    nodes of one CPU each (custom resources `node_a`, `node_b`), this
    process connected as its driver."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 0})
    for name in ("node_a", "node_b"):
        cluster.add_node(num_cpus=1, resources={name: 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    yield cluster
    # In this order, or the driver waits on a cluster that is gone.
    ray.shutdown()
    cluster.shutdown()
