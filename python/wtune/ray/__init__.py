"""Ray Tune trainables whose trials run in wtune's sandbox.

``WasmTrainable`` is a ``ray.tune.Trainable``: each Ray actor holds one
sandboxed trial, so Ray places trials on nodes, restarts them elsewhere
when a node dies, and brings its schedulers and searchers, while every
trial keeps wtune's limits. Checkpoints are wtune's (host snapshots of the
guest's memory, or the guest's own save), written into Ray's checkpoint
directory and synced by Ray's storage.

    from ray import tune
    import wtune.ray

    trainable = wtune.ray.trainable("model.wasm", experiment="experiment.toml")
    tuner = tune.Tuner(trainable, param_space={"lr": tune.loguniform(1e-4, 1e-1)})

``wtune.ray.experiment.tuner`` (and ``python -m wtune.ray run MODEL --config
FILE``) runs a whole ``wtune run`` experiment file on Ray instead.
"""

from ._trainable import CHECKPOINT_FILE, WasmTrainable, trainable

__all__ = ["CHECKPOINT_FILE", "WasmTrainable", "trainable"]
