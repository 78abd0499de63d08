"""``python -m wtune.ray run``: a ``wtune run`` experiment file on a real
multi-node Ray cluster, against ``wtune run`` itself."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import unicodedata

import pytest

ray = pytest.importorskip("ray")
from ray.tune.schedulers import (  # noqa: E402
    ASHAScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
)

import wtune  # noqa: E402
from conftest import DIGITS, REPO  # noqa: E402
from wtune.ray import experiment  # noqa: E402

WTUNE = REPO / "target" / "release" / "wtune"

GRID = """
name = "digits-grid"
metric = "val_loss"
mode = "min"
seed = 7
max_concurrent_trials = 2
compute = "cpu"

[stop]
training_iteration = 3

[limits]
fuel_per_call = 20_000_000_000
memory = "256MiB"
call_timeout = "60s"

[data]
digits = "{data}"

[param_space]
lr = {{ grid_search = [0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3] }}
hidden = 32
batch_size = 64
momentum = 0.8
weight_decay = 1e-4
math = "wasm"
"""


def ray_run(model, config, cluster, storage=None) -> subprocess.CompletedProcess:
    """``python -m wtune.ray run MODEL --config CONFIG`` on the test cluster."""
    storage_path = [] if storage is None else ["--storage-path", str(storage)]
    return subprocess.run(
        [sys.executable, "-m", "wtune.ray", "run", str(model), "--config", str(config),
         "--address", cluster.address, *storage_path],
        capture_output=True,
        text=True,
        timeout=600,
    )


def best_config(output: str) -> set[str]:
    lines = output.splitlines()
    start = lines.index("Best config:") + 1
    return {line.strip() for line in lines[start:] if line.startswith("  ")}


def test_an_experiment_file_runs_on_the_cluster_as_wtune_run_runs_it(cluster, digits, tmp_path):
    config = tmp_path / "experiment.toml"
    config.write_text(GRID.format(data=DIGITS / "data"))
    if not WTUNE.is_file():
        pytest.fail(f"{WTUNE} is missing: cargo build --release builds it")
    local = subprocess.run(
        [str(WTUNE), "run", str(digits), "--config", str(config), "--output-dir", str(tmp_path / "local")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert local.returncode == 0, local.stderr[-3000:]
    on_ray = ray_run(digits, config, cluster, tmp_path / "ray")
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]
    assert "8 trials (8 TERMINATED, 0 ERROR)" in on_ray.stdout, on_ray.stdout
    assert best_config(on_ray.stdout) == best_config(local.stdout), (on_ray.stdout, local.stdout)
    # Ray's usual result files, one directory per trial.
    experiment_dir = tmp_path / "ray" / "digits-grid"
    trials = [d for d in experiment_dir.iterdir() if d.is_dir()]
    assert len(trials) == 8
    nodes = set()
    for trial in trials:
        rows = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
        assert [row["training_iteration"] for row in rows] == [1, 2, 3]
        assert (trial / "progress.csv").is_file()
        nodes.update(row["node_id"] for row in rows)
    assert len(nodes) == 2, "the trials ran on one node only"


def test_a_scheduler_runs_on_the_cluster(cluster, digits, tmp_path):
    # ASHA from the experiment file: Ray takes its metric and mode from
    # TuneConfig, and refuses a scheduler that brings its own.
    config = tmp_path / "experiment.toml"
    text = GRID.format(data=DIGITS / "data").replace(
        "[0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3]", "[0.02, 0.1, 0.2, 0.3]"
    )
    config.write_text(
        text + '\n[scheduler]\ntype = "asha"\nmax_t = 3\ngrace_period = 1\nreduction_factor = 2\n'
    )
    on_ray = ray_run(digits, config, cluster, tmp_path / "ray")
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]
    assert "4 trials (4 TERMINATED, 0 ERROR)" in on_ray.stdout, on_ray.stdout


def plan_of(tmp_path, text: str) -> dict:
    config = tmp_path / "experiment.toml"
    config.write_text(text)
    return json.loads(wtune._native.plan_experiment("model.wasm", str(config)))


@pytest.mark.parametrize(
    "table, kind, checks",
    [
        ('type = "asha"\nmax_t = 20\ngrace_period = 2\nreduction_factor = 3', ASHAScheduler,
         {"_max_t": 20, "_reduction_factor": 3}),
        ('type = "hyperband"\nmax_t = 27', HyperBandScheduler, {"_max_t_attr": 27}),
        ('type = "median_stopping"\ngrace_period = 4', MedianStoppingRule, {"_grace_period": 4}),
        ('type = "pbt"\nperturbation_interval = 3\nhyperparam_mutations = { lr = { uniform = [0.1, 0.2] } }',
         PopulationBasedTraining, {"_perturbation_interval": 3}),
    ],
)
def test_schedulers_map_with_their_parameters(tmp_path, table, kind, checks):
    plan = plan_of(tmp_path, f'metric = "loss"\nmode = "min"\n[scheduler]\n{table}\n')
    scheduler = experiment.scheduler(plan["scheduler"])
    assert isinstance(scheduler, kind)
    for attribute, value in checks.items():
        assert getattr(scheduler, attribute) == value
    # Ray refuses a scheduler with a metric of its own beside TuneConfig's.
    assert scheduler.set_search_properties("loss", "min")


def test_nested_mutations_and_checkpoint_scores_map_as_ray_reads_them(tmp_path):
    plan = plan_of(
        tmp_path,
        'metric = "loss"\nmode = "min"\ncheckpoint_score_attr = "min-val_loss"\n'
        '[scheduler]\ntype = "pbt"\nperturbation_interval = 2\n'
        "[scheduler.hyperparam_mutations]\nmomentum = [0.5, 0.9]\n"
        "optimizer.lr = { uniform = [0.1, 0.2] }\n",
    )
    pbt = experiment.scheduler(plan["scheduler"])
    mutations = pbt._hyperparam_mutations
    assert set(mutations) == {"momentum", "optimizer"}, mutations
    assert set(mutations["optimizer"]) == {"lr"}, mutations
    assert experiment._score(plan["spec"]["checkpoint"]["score_attr"]) == ("val_loss", "min")
    assert experiment._score("accuracy") == ("accuracy", "max")
    assert experiment._score(None) == (None, "max")


def test_notes_about_fuel_order_give_way_to_rays_arrival_order(tmp_path):
    fuel = plan_of(
        tmp_path,
        'metric = "loss"\nmode = "min"\nnum_samples = 4\n[scheduler]\ntype = "asha"\n'
        'time_attr = "fuel_total"\n'
        "max_t = 1e9\ngrace_period = 1e7\n",
    )
    assert fuel["spec"]["result_order"] == "fuel"
    assert any("fuel order" in note for note in fuel["notes"]), fuel["notes"]
    notes = experiment.plan_notes(fuel)
    assert not any("fuel order" in note and "Ray" not in note for note in notes), notes
    assert any(note.startswith("Ray hands results") for note in notes), notes
    arrival = plan_of(tmp_path, 'metric = "loss"\nmode = "min"\n')
    assert experiment.plan_notes(arrival) == arrival["notes"]


def test_stop_criteria_map_as_wtune_reads_them(tmp_path):
    plan = plan_of(
        tmp_path,
        '[stop]\ntraining_iteration = 5\nval_accuracy = 0.9\nloss = { at_most = 0.1 }\n',
    )
    stop = experiment.Criteria(plan["spec"]["stop"])
    assert not stop("t", {"training_iteration": 4, "val_accuracy": 0.5, "loss": 1.0})
    assert stop("t", {"training_iteration": 5})
    assert stop("t", {"training_iteration": 1, "val_accuracy": 0.9})
    assert stop("t", {"training_iteration": 1, "loss": 0.1})


def test_keys_ray_cannot_honour_are_refused_with_the_reason(cluster, digits, tmp_path):
    cases = {
        'metric = "loss"\nsearch = "tpe"': "search: not mapped onto Ray Tune",
        "[stop_experiment]\nmax_trials = 3": "stop_experiment: not mapped onto Ray Tune",
        "[resources]\ncpu = 4": "resources: not mapped onto Ray Tune",
        'metric = "loss"\n[scheduler]\ntype = "asha"\nvariant = "promotion"': "scheduler.variant",
        "[limits]\nmemroy = 1": "line 2, column 1 | 2 | memroy = 1 | ^^^^^^ unknown field `memroy`",
    }
    for text, words in cases.items():
        config = tmp_path / "bad.toml"
        config.write_text(text + "\n")
        with pytest.raises(wtune.ConfigError) as refused:
            experiment.tuner(digits, config, storage_path=tmp_path)
        assert words in str(refused.value)
    with pytest.raises(wtune.ComponentError, match="no-such.wasm"):
        experiment.tuner(tmp_path / "no-such.wasm", None, storage_path=tmp_path)
    # The command says so in one line and exits 2.
    config = tmp_path / "bad.toml"
    config.write_text('metric = "loss"\nsearch = "tpe"\n')
    command = ray_run(digits, config, cluster)
    assert command.returncode == 2
    assert "error: search: not mapped onto Ray Tune" in command.stderr


def test_guest_text_reaches_the_terminal_inert(cluster, hostile, tmp_path):
    # The `terminal` attack's error is full of terminal escapes and forges
    # a "Best trial:" line; what the operator sees must carry it escaped.
    config = tmp_path / "experiment.toml"
    config.write_text(
        'name = "terminal"\nmetric = "score"\nmode = "max"\n[param_space]\n'
        'attack = { grid_search = ["none", "terminal"] }\nat = 1\niterations = 2\n'
    )
    run = ray_run(hostile, config, cluster, tmp_path / "ray")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "2 trials (1 TERMINATED, 1 ERROR)" in run.stdout, run.stdout
    assert "\\u{1b}[2J\\u{1b}]0;pwned\\u{7}" in run.stdout, run.stdout
    for text in (run.stdout, run.stderr):
        # Ray colours its own tracebacks (cyan, then the default colour)
        # and its log lines hold tabs; any other control is the guest's.
        own = re.sub(r"\x1b\[3[69]m|\t", "", text)
        controls = [c for c in own if c != "\n" and unicodedata.category(c) == "Cc"]
        assert not controls, (controls[:5], text[-3000:])
        assert not any(line.startswith("Best trial: trial_9999") for line in text.splitlines())
