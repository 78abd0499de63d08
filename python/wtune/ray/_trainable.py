"""`WasmTrainable`: one sandboxed trial per Ray actor."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Union

import ray
from ray import tune

from .. import BadOutput, ComponentError, ConfigError, Trainable, _native
from .._cuda import pci_address
from .._settings import trial_settings

#: The file a checkpoint directory holds.
CHECKPOINT_FILE = "trial.wtsnap"


class WasmTrainable(tune.Trainable):
    """A Ray Tune trainable that runs its trial in wtune's sandbox.

    Give it the component and its trial settings with
    ``tune.with_parameters(WasmTrainable, wasm=..., settings=..., base_dir=...)``,
    or build it with `trainable`, which reads them from an experiment file
    and keyword arguments.

    - ``step`` runs one ``train()`` and reports the guest's metrics with
      ``fuel_this_iter``, ``fuel_total``, ``training_iteration`` (the
      sandbox's count, which a restore continues) and ``node_id``.
    - ``save_checkpoint`` writes the trial's checkpoint into Ray's
      checkpoint directory; ``load_checkpoint`` continues from one, taken on
      any node, and a checkpoint of another trial (a PBT exploit) continues
      with this trial's config through the guest's ``reset``.
    - ``reset_config`` (``reuse_actors=True``) starts the new trial in a
      fresh instance of the component the actor has already compiled, in a
      sandbox directory of its own.
    - the guest's ``setup`` runs at the first ``step``, not in ``setup``:
      a trial Ray recovers (or a PBT exploit on a reused actor) restores
      its checkpoint without first setting up an instance it would throw
      away. A setup that fails fails the first step, with its reason.
    - host compute runs the trial's kernels on the GPU Ray gave it (found
      by its PCI address), unless the settings say ``compute = "cpu"``.
    - a failing guest raises the `wtune.TrialError` subclass that says why;
      Ray marks the trial ERROR with it, and the actor process is unharmed.
    """

    def setup(
        self,
        config: dict,
        wasm: Union[str, "os.PathLike[str]", bytes, None] = None,
        settings: Mapping[str, Any] | None = None,
        base_dir: str | None = None,
    ) -> None:
        if wasm is None:
            raise ConfigError(
                "WasmTrainable needs its component: use wtune.ray.trainable(wasm, ...) or "
                "tune.with_parameters(WasmTrainable, wasm=PATH_OR_BYTES)"
            )
        self._trial = Trainable.from_settings(
            wasm,
            config,
            settings or {},
            base_dir or os.getcwd(),
            trial_dir=Path(self.logdir) / "sandbox",
            trial_id=self.trial_id or "trial",
            # Ray calls setup before load_checkpoint when it recovers a
            # trial: the guest's setup waits for the first step, so a
            # restore replaces nothing it paid for.
            deferred=True,
            gpu=None if (settings or {}).get("compute") == "cpu" else ray_gpu(),
        )
        self._node_id = ray.get_runtime_context().get_node_id()

    def step(self) -> dict:
        result = self._trial.train()
        if "node_id" in result:
            raise BadOutput(
                f"train() at iteration {result['training_iteration']} returned a bad result: "
                "the trainable reported a metric named `node_id`, which wtune.ray fills in "
                "itself; rename it"
            )
        result["node_id"] = self._node_id
        # Ray keeps its own clock; the sandbox's per-call time is the same
        # iteration's and is kept, the total is Ray's.
        result.pop("time_total_s", None)
        return result

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self._trial.save(Path(checkpoint_dir) / CHECKPOINT_FILE)

    def load_checkpoint(self, checkpoint: Union[str, dict, None]) -> None:
        if not isinstance(checkpoint, (str, os.PathLike)):
            raise ConfigError(f"not a wtune checkpoint directory: {checkpoint!r}")
        self._trial.restore(Path(checkpoint) / CHECKPOINT_FILE, config=self.config)

    def reset_config(self, new_config: dict) -> bool:
        # Ray has moved `logdir` to the new trial's directory: its guest
        # gets a sandbox there, not the old trial's files (and disk quota).
        # A PBT exploit follows with load_checkpoint: set up only if not.
        self._trial.restart(
            new_config,
            deferred=True,
            trial_dir=Path(self.logdir) / "sandbox",
            trial_id=self.trial_id or "trial",
        )
        return True

    def cleanup(self) -> None:
        trial = getattr(self, "_trial", None)
        if trial is not None:
            trial.close()


def ray_gpu() -> str | None:
    """The PCI address of the first GPU Ray gave this trial, for host
    compute to run the trial's kernels on; `None` when Ray gave it none.
    Vulkan ignores ``CUDA_VISIBLE_DEVICES`` and numbers GPUs its own way,
    so the device is named by the address every API agrees on."""
    ids = ray.get_gpu_ids()
    return pci_address(ids[0]) if ids else None


def trainable(
    wasm: Union[str, "os.PathLike[str]", bytes],
    *,
    experiment: Union[str, "os.PathLike[str]", None] = None,
    resources: Mapping[str, float] | None = None,
    **settings: Any,
):
    """`WasmTrainable` with its component and trial settings bound, for
    ``tune.Tuner``. The component is read here, on the driver, and shipped
    to the nodes through Ray's object store, so the nodes need no copy of
    it. ``experiment`` and ``settings`` (``limits``, ``data``, ``compute``,
    ``checkpoint``, ``security``, ``snapshot_key_file``) are those of
    `wtune.Trainable`. ``resources`` (e.g. ``{"cpu": 1, "gpu": 1,
    "node_a": 1}``) goes to ``tune.with_resources``. Data directories must
    exist at the same path on every node."""
    settings, base = trial_settings(experiment, **settings)
    # Misspelt keys are refused here, on the driver: they would otherwise
    # fail every trial's setup on the workers, again at each retry.
    _native.check_trial_settings(json.dumps(settings))
    if not isinstance(wasm, (bytes, bytearray, memoryview)):
        try:
            wasm = Path(wasm).read_bytes()
        except OSError as e:
            raise ComponentError(f"cannot read {os.fspath(wasm)}: {e}") from None
    bound = tune.with_parameters(
        WasmTrainable, wasm=bytes(wasm), settings=settings, base_dir=str(base)
    )
    if resources:
        bound = tune.with_resources(bound, dict(resources))
    return bound
