"""wtune.ray.WasmTrainable under Ray Tune, on the real multi-node Ray
cluster of conftest.py (a head with no CPUs and two worker nodes, so every
trial runs on a worker node and a node can be killed under a running
experiment)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray import tune  # noqa: E402
from ray.tune import Callback  # noqa: E402
from ray.tune.schedulers import PopulationBasedTraining  # noqa: E402

import wtune  # noqa: E402
import wtune.ray  # noqa: E402
from conftest import DIGITS, DIGITS_CONFIG  # noqa: E402

LIMITS = {"memory": "64MiB", "fuel_per_call": "1e9", "call_timeout": "5s"}


def add_worker(cluster, name):
    cluster.add_node(num_cpus=1, resources={name: 1})
    cluster.wait_for_nodes()


def alive_nodes() -> int:
    return sum(node["Alive"] for node in ray.nodes())


def worker_resources() -> list[str]:
    """The custom resources that name the live worker nodes (a node killed
    by an earlier test is replaced by one named `replacement`)."""
    names = ("node_a", "node_b", "replacement")
    return sorted(
        name for node in ray.nodes() if node["Alive"] for name in node["Resources"] if name in names
    )


def run(trainable, param_space, tmp_path, **tune_config):
    run_config = tune.RunConfig(
        storage_path=str(tmp_path),
        name="exp",
        verbose=0,
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1),
        failure_config=tune.FailureConfig(max_failures=tune_config.pop("max_failures", 0)),
        callbacks=tune_config.pop("callbacks", []),
        stop=tune_config.pop("stop", None),
    )
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(**tune_config),
        run_config=run_config,
    ).fit()


def test_trials_spread_over_nodes_and_match_a_local_run(cluster, digits, tmp_path):
    lrs = [0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3]
    trainable = wtune.ray.trainable(digits, experiment=DIGITS / "experiment.toml")
    grid = run(
        trainable,
        {**DIGITS_CONFIG, "lr": tune.grid_search(lrs)},
        tmp_path,
        metric="val_accuracy",
        mode="max",
        stop={"training_iteration": 3},
    )
    assert not grid.errors
    assert len(grid) == 8
    results = [r for r in grid]
    assert {r.metrics["training_iteration"] for r in results} == {3}
    assert len({r.metrics["node_id"] for r in results}) == 2, "trials ran on one node only"
    # The same configurations, run here: the same numbers, bit for bit.
    local = {}
    for lr in lrs:
        trial = wtune.Trainable(digits, {**DIGITS_CONFIG, "lr": lr}, experiment=DIGITS / "experiment.toml")
        for _ in range(3):
            report = trial.train()
        local[lr] = report["val_loss"]
    for result in results:
        assert result.metrics["val_loss"] == local[result.config["lr"]]
    best = grid.get_best_result()
    assert best.config["lr"] == max(lrs, key=lambda lr: (next(
        r.metrics["val_accuracy"] for r in results if r.config["lr"] == lr
    ), -lr))


def test_hostile_guests_end_in_error_with_their_reason_and_harm_nobody(cluster, hostile, tmp_path):
    trainable = wtune.ray.trainable(hostile, limits={**LIMITS, "call_timeout": "2s"})
    attacks = {
        "panic": (wtune.GuestTrap, "hostile guest panicked on purpose"),
        "memory_bomb": (wtune.MemoryExceeded, "memory limit 64 MiB exceeded"),
        "loop_train": (wtune.FuelExhausted, "per-call fuel limit of 1e9"),
        "sleep_train": (wtune.DeadlineExceeded, "exceeded its 2s deadline"),
        "none": (None, None),
    }
    grid = run(
        trainable,
        {"attack": tune.grid_search(sorted(attacks)), "at": 2, "iterations": 3},
        tmp_path,
    )
    by_attack = {r.config["attack"]: r for r in grid}
    for attack, (exception, words) in attacks.items():
        result = by_attack[attack]
        if exception is None:
            assert result.error is None
            assert result.metrics["score"] == 3.0
            continue
        cause = getattr(result.error, "cause", result.error)
        assert isinstance(cause, exception), f"{attack}: {result.error!r}"
        assert words in str(result.error)
        # The trial got as far as the attack: its first iteration reported.
        assert result.metrics["training_iteration"] == 1
    assert alive_nodes() == 3


#: The cluster `KillNodeAt` acts on: Tune pickles its callbacks with the
#: experiment's state, and a cluster handle does not pickle.
CLUSTERS = {}


class KillNodeAt(Callback):
    """Removes the worker node a trial runs on once that trial reports
    `iteration`, then adds a fresh node so the experiment can go on. Runs in
    the driver's main thread, where Ray's cluster utilities must be called."""

    def __init__(self, iteration):
        self.iteration = iteration
        self.killed = None

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.killed is None and result["training_iteration"] == self.iteration:
            cluster = CLUSTERS["cluster"]
            node = next(n for n in cluster.worker_nodes if n.node_id == result["node_id"])
            self.killed = (trial.trial_id, result["node_id"])
            cluster.remove_node(node)
            add_worker(cluster, "replacement")


def test_a_reused_actor_gives_each_trial_a_sandbox_of_its_own(cluster, hostile, tmp_path):
    # One trial at a time on one node: Ray hands each trial the actor the
    # last one ran in (reset_config). The probe lists its directory, then
    # writes probe.txt there: a trial shown the last trial's directory
    # would list that file.
    trainable = tune.with_resources(
        wtune.ray.trainable(hostile, limits=LIMITS), {"cpu": 1, worker_resources()[0]: 1}
    )
    grid = run(
        trainable,
        {"attack": "probe", "iterations": 1, "n": tune.grid_search([1, 2, 3])},
        tmp_path,
        reuse_actors=True,
        max_concurrent_trials=1,
    )
    assert not grid.errors
    assert len({result.metrics["pid"] for result in grid}) == 1, "no actor was reused"
    for result in grid:
        assert result.metrics["cwd_write_ok"] == 1, result.path
        assert result.metrics["cwd_entries"] == 0, result.path


def test_a_killed_node_s_trials_continue_from_their_last_snapshot(cluster, hostile, tmp_path):
    CLUSTERS["cluster"] = cluster
    kill = KillNodeAt(iteration=3)
    trainable = wtune.ray.trainable(hostile, limits=LIMITS)
    grid = run(
        trainable,
        {"iterations": 8, "pace_ms": 300, "seed": tune.grid_search([1, 2])},
        tmp_path,
        max_failures=2,
        callbacks=[kill],
    )
    assert kill.killed is not None
    assert not grid.errors
    victim, dead_node = kill.killed
    for result in grid:
        # The guest counts its own iterations in its memory: a trial that
        # started over would report a lower score than Ray's count.
        assert result.metrics["training_iteration"] == 8
        assert result.metrics["score"] == 8.0
        history = result.metrics_dataframe["training_iteration"].tolist()
        assert history.count(1) == 1, f"a trial started over: {history}"
        if result.path.endswith(victim) or victim in result.path:
            assert result.metrics["node_id"] != dead_node
            # Nothing before the last checkpoint was lost: the iterations
            # after the kill continue from the snapshot at iteration 3.
            assert sorted(set(history)) == list(range(1, 9))
    assert alive_nodes() >= 3


class SynchronousPBT(PopulationBasedTraining):
    """Ray 2.60's synchronous PBT without a race that ends a clone early.

    A trial that reaches the perturbation point first pauses, and its pause
    saves a checkpoint. When the last trial arrives while that save is still
    in flight, the exploit pauses the first one again without a checkpoint;
    Ray's `_schedule_trial_stop` sees a save in progress and caches a STOP for
    the trial, and nothing clears it. The clone then restarts from its donor,
    trains one step, and that cached STOP ends it as TERMINATED after its
    next save, so it never reaches the stop criterion. This is Ray's, not
    wtune's, and it is timing-dependent (about one run in two on a 2-core
    machine); the exploit itself is left to Ray.
    """

    def _exploit(self, tune_controller, trial, trial_to_clone):
        was_saving = trial.is_saving
        super()._exploit(tune_controller, trial, trial_to_clone)
        if was_saving:
            tune_controller._cached_trial_decisions.pop(trial.trial_id, None)


def test_pbt_clones_continue_from_the_donor_s_snapshot(cluster, digits, tmp_path):
    # Two trials, each pinned to a worker node of its own (by the custom
    # resource of the node): every exploit clones the snapshot of a trial
    # on the other node.
    low, high = worker_resources()[:2]
    pbt = SynchronousPBT(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"lr": [0.01, 0.3]},
        quantile_fraction=0.5,
        # Both trials meet at every perturbation point, so the worse one
        # clones the better whatever their pace (asynchronous PBT skips an
        # exploit of a trial that has no checkpoint yet).
        synch=True,
    )
    trainable = tune.with_resources(
        wtune.ray.trainable(digits, experiment=DIGITS / "experiment.toml"),
        # Ray sizes a trial once, from its first config.
        lambda config: {"cpu": 1, low if config["lr"] < 0.1 else high: 1},
    )
    grid = run(
        trainable,
        {**DIGITS_CONFIG, "lr": tune.grid_search([0.005, 0.3])},
        tmp_path,
        metric="val_accuracy",
        mode="max",
        scheduler=pbt,
        stop={"training_iteration": 6},
        # An exploit on a reused actor: reset_config starts the clone's
        # instance, load_checkpoint puts the donor's snapshot in it.
        reuse_actors=True,
    )
    assert not grid.errors
    histories = {}
    for result in grid:
        rows = [json.loads(line) for line in (Path(result.path) / "result.json").read_text().splitlines()]
        iterations = [row["training_iteration"] for row in rows]
        # A clone reports the donor's iteration count plus one, never 1 again.
        assert iterations.count(1) == 1 and iterations[-1] == 6, iterations
        histories[Path(result.path)] = rows
    assert len({row["node_id"] for rows in histories.values() for row in rows}) == 2

    # Every exploit, replayed here from the donor's snapshot with the
    # clone's new config: the clone's first result after it, bit for bit.
    exploits = 0
    for clone, rows in histories.items():
        for before, after in zip(rows, rows[1:]):
            if after["config"] == before["config"]:
                continue
            exploits += 1
            donor_iteration = after["training_iteration"] - 1
            replayed = [
                replay(digits, checkpoint, after["config"])
                for donor in histories
                if donor != clone
                for checkpoint in sorted(donor.glob("checkpoint_*/trial.wtsnap"))
                if snapshot_iteration(digits, checkpoint) == donor_iteration
            ]
            assert replayed, f"no checkpoint of the other trial at iteration {donor_iteration}"
            metrics = {k: after[k] for k in replayed[0]}
            assert metrics in replayed, (metrics, replayed)
            donor_nodes = {
                row["node_id"]
                for donor, donor_rows in histories.items()
                if donor != clone
                for row in donor_rows
                if row["training_iteration"] == donor_iteration
            }
            assert after["node_id"] not in donor_nodes, "the clone ran on its donor's node"
    assert exploits > 0, "PBT exploited nothing"


def snapshot_iteration(digits, checkpoint: Path) -> int:
    return wtune.Trainable(digits, experiment=DIGITS / "experiment.toml", restore=checkpoint).iteration


def replay(digits, checkpoint: Path, config: dict) -> dict:
    """The guest's metrics of one step from `checkpoint`, switched to
    `config` as a PBT exploit switches it."""
    trial = wtune.Trainable(digits, config, experiment=DIGITS / "experiment.toml", restore=checkpoint)
    report = trial.train()
    automatic = {"done", "fuel_this_iter", "fuel_total", "time_this_iter_s", "time_total_s"}
    return {k: v for k, v in report.items() if k not in automatic}


def test_bad_input_gets_a_clear_error(cluster, hostile, tmp_path):
    with pytest.raises(wtune.ComponentError, match="missing.wasm"):
        wtune.ray.trainable(tmp_path / "missing.wasm")
    with pytest.raises(wtune.ConfigError, match="limtis"):
        wtune.ray.trainable(hostile, limtis={"memory": "1GiB"})
    with pytest.raises(wtune.ConfigError, match="limits: unknown field `memroy`"):
        wtune.Trainable(hostile, {}, limits={"memroy": "1GiB"})
    # Refused on the driver, not in every trial's setup on the workers.
    with pytest.raises(wtune.ConfigError, match="limits: unknown field `memroy`"):
        wtune.ray.trainable(hostile, limits={"memroy": "1GiB"})
    # A misspelt table of an experiment file is named, not dropped.
    misspelt = tmp_path / "experiment.toml"
    misspelt.write_text('[limts]\nmemory = "1GiB"\n')
    with pytest.raises(wtune.ConfigError, match="limts"):
        wtune.ray.trainable(hostile, experiment=misspelt)
    with pytest.raises(wtune.ConfigError, match="limts"):
        wtune.Trainable(hostile, {}, experiment=misspelt)
    # A config the guest's setup() rejects: the trial ends ERROR saying so.
    grid = run(wtune.ray.trainable(hostile), {"attack": "no-such-attack"}, tmp_path)
    error = grid[0].error
    assert error is not None
    assert "setup() failed" in str(error) and "no-such-attack" in str(error)
    assert alive_nodes() >= 3
