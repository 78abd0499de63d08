"""A ``wtune run`` experiment file on Ray Tune.

The file is planned by wtune itself (`_native.plan_experiment`: every key
checked and every default applied as ``wtune run`` applies them), then
mapped onto a ``tune.Tuner``: the search space, metric and mode,
``num_samples``, ``seed`` (random search), ``max_concurrent_trials``, the
scheduler (ASHA, HyperBand, median stopping, PBT, with Ray's parameter
names, which are wtune's), ``[stop]``, checkpointing, ``max_failures`` and
``fail_fast``, ``resources_per_trial``, and the trial settings (limits,
data, compute, checkpoint, security) of every trial. A key Ray cannot
honour as wtune does is refused with the reason, never silently dropped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import json

import ray
from ray import tune
from ray.tune.schedulers import (
    ASHAScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
)
from ray.tune.search.basic_variant import BasicVariantGenerator

from .. import ConfigError, WtuneError, _native
from .._settings import read_experiment
from ._trainable import trainable as bind_trainable

#: The domain names of wtune's ``param_space`` syntax.
DOMAINS = ("grid_search", "choice", "uniform", "loguniform", "randint", "quniform")


@dataclass
class Experiment:
    """A planned experiment, ready to run on Ray."""

    tuner: tune.Tuner
    name: str
    metric: str | None
    mode: str
    #: Where Ray writes the experiment's results.
    path: Path
    #: What the user should know (wtune's plan notes, and what Ray changes).
    notes: list[str] = field(default_factory=list)


def domain(value: Any) -> Any:
    """A ``param_space`` value in wtune's syntax as Ray's: a table with one
    key naming a domain is that domain; other tables are searched inside."""
    if isinstance(value, dict):
        if len(value) == 1:
            ((name, args),) = value.items()
            if name in DOMAINS:
                return _domain(name, args)
        return {key: domain(inner) for key, inner in value.items()}
    return value


def _domain(name: str, args: Any) -> Any:
    if name == "grid_search":
        return tune.grid_search(list(args))
    if name == "choice":
        return tune.choice(list(args))
    if name == "uniform":
        return tune.uniform(*args)
    if name == "loguniform":
        return tune.loguniform(*args)
    if name == "randint":
        return tune.randint(*args)
    return tune.quniform(*args)


def _refuse(key: str, why: str) -> ConfigError:
    return ConfigError(f"{key}: not mapped onto Ray Tune: {why}")


def _check_mappable(file: dict, plan: dict) -> None:
    """Refuses the keys Ray cannot honour as ``wtune run`` does."""
    resources = file.get("resources")
    if resources is not None and set(resources) - {"custom"}:
        raise _refuse(
            "resources",
            "on Ray the cluster's nodes have the resources; keep only [resources] custom "
            "(naming the custom resources trials ask for) and ask per trial with "
            "resources_per_trial",
        )
    if file.get("stop_experiment"):
        raise _refuse("stop_experiment", "Ray Tune stops trials, not experiments, here; use [stop]")
    if file.get("restore_from") is not None:
        raise _refuse("restore_from", "start trials from one checkpoint with wtune run")
    if file.get("deterministic") is True:
        raise _refuse(
            "deterministic",
            "Ray hands results to its scheduler as they arrive; fuel-time order is wtune run's",
        )
    tracking = file.get("tracking") or {}
    if tracking.get("mlflow") is not None:
        raise _refuse(
            "tracking.mlflow",
            "log to MLflow from Ray with ray.air.integrations.mlflow.MLflowLoggerCallback",
        )
    search = plan["search"]
    if search["type"] != "random":
        raise _refuse(
            "search",
            f"search = {search['type']!r} is wtune's own searcher; on Ray use random search "
            "(the default) or build the Tuner in Python with a Ray searcher and "
            "wtune.ray.trainable",
        )
    scheduler = plan["scheduler"]
    if scheduler["type"] == "asha" and scheduler.get("variant") == "promotion":
        raise _refuse("scheduler.variant", "Ray's ASHA has no promotion variant; use \"stopping\"")


def scheduler(spec: dict):
    """Ray's scheduler for wtune's planned ``scheduler`` (same names and
    parameters). Its metric and mode come from ``tune.TuneConfig``: Ray
    refuses a scheduler made with its own as well."""
    kind = spec["type"]
    if kind == "fifo":
        return FIFOScheduler()
    common = {"time_attr": spec["time_attr"]}
    if kind == "asha":
        return ASHAScheduler(
            max_t=_number(spec["max_t"]),
            grace_period=_number(spec["grace_period"]),
            reduction_factor=spec["reduction_factor"],
            brackets=spec["brackets"],
            **common,
        )
    if kind == "hyperband":
        return HyperBandScheduler(
            max_t=_number(spec["max_t"]),
            reduction_factor=spec["reduction_factor"],
            stop_last_trials=spec["stop_last_trials"],
            **common,
        )
    if kind == "median_stopping":
        return MedianStoppingRule(
            grace_period=_number(spec["grace_period"]),
            min_samples_required=spec["min_samples_required"],
            **common,
        )
    if kind == "pbt":
        return PopulationBasedTraining(
            perturbation_interval=_number(spec["perturbation_interval"]),
            burn_in_period=_number(spec["burn_in_period"]),
            hyperparam_mutations=_nested(
                {
                    name: mutation if isinstance(mutation, list) else domain(mutation)
                    for name, mutation in spec["hyperparam_mutations"].items()
                }
            ),
            quantile_fraction=spec["quantile_fraction"],
            resample_probability=spec["resample_probability"],
            perturbation_factors=tuple(spec["perturbation_factors"]),
            require_attrs=spec["require_attrs"],
            **common,
        )
    raise ConfigError(f"scheduler {kind!r} is not mapped onto Ray Tune")


def _nested(flat: dict) -> dict:
    """wtune's mutations by dotted name (``optimizer.lr``) as the nested
    tables Ray's PBT finds them in a trial's config by."""
    nested: dict = {}
    for name, value in flat.items():
        *tables, last = name.split(".")
        at = nested
        for table in tables:
            at = at.setdefault(table, {})
        at[last] = value
    return nested


def _score(attr: str | None) -> tuple[str | None, str]:
    """wtune's ``checkpoint_score_attr`` (``min-`` for lower is better, as
    Ray Tune's old ``checkpoint_score_attr``) as ``CheckpointConfig``'s
    attribute and order."""
    if attr is not None and attr.startswith("min-"):
        return attr[len("min-"):], "min"
    return attr, "max"


class Criteria(tune.Stopper):
    """wtune's ``[stop]``: a trial stops when any criterion is reached
    (``training_iteration``, ``time_total_s``, ``fuel_total``, and metric
    thresholds: ``>=`` a plain value, ``at_most``/``at_least`` tables)."""

    def __init__(self, stop: dict) -> None:
        self.limits = {
            key: stop[key]
            for key in ("training_iteration", "time_total_s", "fuel_total")
            if stop.get(key) is not None
        }
        self.thresholds = [
            (t["metric"], *next(iter(t["bound"].items()))) for t in stop.get("thresholds", [])
        ]

    def __call__(self, trial_id: str, result: dict) -> bool:
        for key, limit in self.limits.items():
            if result.get(key, float("-inf")) >= limit:
                return True
        for metric, bound, value in self.thresholds:
            reported = result.get(metric)
            if reported is None:
                continue
            if bound == "AtLeast" and reported >= value:
                return True
            if bound == "AtMost" and reported <= value:
                return True
        return False

    def stop_all(self) -> bool:
        return False


def plan_notes(plan: dict) -> list[str]:
    """wtune's notes on the plan, as they hold on Ray: Ray hands results to
    the scheduler as they arrive, so where wtune would decide in fuel order,
    its notes about that order give way to one saying Ray does not."""
    notes = list(plan["notes"])
    if plan["spec"].get("result_order") == "fuel":
        notes = [note for note in notes if "fuel order" not in note]
        notes.append(
            "Ray hands results to the scheduler as they arrive, not in fuel order "
            "(wtune run's default for this scheduler): decisions may differ between runs"
        )
    return notes


def _resources(spec: dict, notes: list[str]) -> dict:
    request = {"cpu": spec["cpu"], "gpu": spec["gpu"]}
    if spec["memory"]:
        request["memory"] = spec["memory"]
    request.update(spec["custom"])
    if request["gpu"] and not ray.cluster_resources().get("GPU"):
        # As wtune run drops a trial's GPU share on the CPU backend.
        notes.append(
            f"resources_per_trial.gpu = {request['gpu']} dropped: the Ray cluster has no GPUs"
        )
        request["gpu"] = 0
    return request


def tuner(
    model: "os.PathLike[str] | str",
    config: "os.PathLike[str] | str | None" = None,
    *,
    storage_path: "os.PathLike[str] | str | None" = None,
) -> Experiment:
    """The experiment ``wtune run MODEL --config CONFIG`` would run, as a
    ``tune.Tuner`` (``ray.init`` must have been called). Results go to
    ``storage_path/<name>``, by default the experiment's ``output_dir``.
    Raises `ConfigError` for a key that is wrong, or right for ``wtune
    run`` but not mappable onto Ray, and `ComponentError` for a model that
    cannot be read."""
    plan = json.loads(_native.plan_experiment(os.fspath(model), None if config is None else os.fspath(config)))
    file = read_experiment(config) if config is not None else {}
    _check_mappable(file, plan)
    spec = plan["spec"]
    notes = plan_notes(plan)
    metric, mode = spec["metric"], spec["mode"]
    # The trial settings (limits, data, ...) are read from the file as
    # wtune.Trainable reads them.
    bound = bind_trainable(
        model, experiment=config, resources=_resources(spec["resources_per_trial"], notes)
    )
    output = Path(storage_path) / spec["name"] if storage_path else Path(spec["output_dir"]).resolve()
    checkpoint = spec["checkpoint"]
    score_attr, score_order = _score(checkpoint["score_attr"])
    failure = spec["failure"]
    max_failures = failure["max_failures"]
    fail_fast = {"off": False, "stop": True, "raise": "raise"}[failure["fail_fast"]]
    search = plan["search"]
    run_config = tune.RunConfig(
        name=output.name,
        storage_path=str(output.parent),
        stop=Criteria(spec["stop"]),
        checkpoint_config=tune.CheckpointConfig(
            checkpoint_frequency=checkpoint["freq"],
            checkpoint_at_end=checkpoint["at_end"],
            num_to_keep=checkpoint["keep_num"],
            checkpoint_score_attribute=score_attr,
            checkpoint_score_order=score_order,
        ),
        failure_config=tune.FailureConfig(
            max_failures=-1 if max_failures is None else max_failures, fail_fast=fail_fast
        ),
        verbose=1,
    )
    tune_config = tune.TuneConfig(
        metric=metric,
        mode=mode if metric else None,
        num_samples=plan["num_samples"],
        max_concurrent_trials=spec["max_concurrent"],
        scheduler=scheduler(plan["scheduler"]),
        search_alg=BasicVariantGenerator(
            random_state=plan["seed"], max_concurrent=search.get("max_concurrent") or 0
        ),
    )
    return Experiment(
        tuner=tune.Tuner(
            bound,
            param_space=domain(plan["param_space"]),
            tune_config=tune_config,
            run_config=run_config,
        ),
        name=spec["name"],
        metric=metric,
        mode=mode,
        path=output,
        notes=notes,
    )


def summary(experiment: Experiment, grid, seconds: float) -> str:
    """What ``wtune run`` prints at the end, for a Ray result grid: the
    trials are handed to wtune's own summary, which ranks them and makes
    the guests' error text inert."""
    trials = []
    for result in grid:
        metrics = result.metrics or {}
        value = metrics.get(experiment.metric) if experiment.metric else None
        error = None
        if result.error is not None:
            cause = getattr(result.error, "cause", None) or result.error
            # wtune's own reason whole (wtune makes it inert); of anything
            # else, the last line of Ray's traceback.
            lines = str(cause).strip().splitlines() or ["unknown"]
            error = str(cause) if isinstance(cause, WtuneError) else lines[-1]
        trials.append(
            {
                "trial_id": str(metrics.get("trial_id", result.path)),
                "status": "ERROR" if result.error is not None else "TERMINATED",
                "config": result.config or {},
                "iterations": int(metrics.get("training_iteration") or 0),
                "value": float(value) if _finite(value) else None,
                "checkpoint": None if result.checkpoint is None else result.checkpoint.path,
                "error": error,
            }
        )
    outcome = {
        "name": experiment.name,
        "output_dir": str(experiment.path),
        "wall_time_s": seconds,
        "metric": experiment.metric,
        "mode": experiment.mode,
        "trials": trials,
    }
    return _native.summary_text(json.dumps(outcome, default=str)).rstrip("\n")


def _number(value: float) -> float | int:
    # Ray counts iterations in ints; wtune plans every time in floats.
    return int(value) if float(value).is_integer() else value


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and value == value and abs(value) != float("inf")
