"""wtune for Python: WebAssembly trainables in wtune's sandbox.

`Trainable` runs one trial of a component built against the
``wtune:trainable`` WIT world with the limits ``wtune run`` gives it (fuel
per call and per trial, memory, call deadlines, a filesystem of the trial's
own directory plus read-only data, log caps) and the same compiled-component
cache. `wtune.ray.WasmTrainable` makes a Ray Tune trainable of it.

Every failure raises a subclass of `WtuneError` whose message is the reason
``wtune run`` would give: `FuelExhausted`, `MemoryExceeded`,
`DeadlineExceeded`, `QuotaExceeded`, `GuestTrap`, `GuestError`, `BadOutput`
and `DeviceLost` (all `TrialError`), `ComponentError`, `ConfigError`,
`CheckpointError`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, Union

from . import _native
from ._native import (
    BadOutput,
    CheckpointError,
    ComponentError,
    ConfigError,
    DeadlineExceeded,
    DeviceLost,
    FuelExhausted,
    GuestError,
    GuestTrap,
    MemoryExceeded,
    QuotaExceeded,
    TrialError,
    WtuneError,
)
from ._settings import TRIAL_KEYS, trial_settings

__version__ = _native.__version__

__all__ = [
    "Trainable",
    "TRIAL_KEYS",
    "WtuneError",
    "ConfigError",
    "ComponentError",
    "TrialError",
    "FuelExhausted",
    "MemoryExceeded",
    "DeadlineExceeded",
    "QuotaExceeded",
    "GuestTrap",
    "GuestError",
    "BadOutput",
    "DeviceLost",
    "CheckpointError",
]

PathLike = Union[str, "os.PathLike[str]"]


def _serve_workers() -> None:
    # wtune compiles untrusted components, and runs GPU work, in helper
    # processes of its own executable; here that is Python, so the helpers
    # are this package's native module run by this interpreter (isolated:
    # the environment of the Ray worker does not leak into a compiler).
    package_parent = str(Path(__file__).resolve().parent.parent)
    code = (
        "import sys; sys.path.insert(0, %r); from wtune import _native; "
        "sys.exit(_native.serve_worker(sys.argv[1:]))" % package_parent
    )
    _native.serve_workers_with(sys.executable, ["-I", "-c", code])


_serve_workers()


class Trainable:
    """One trial of a WebAssembly trainable in wtune's sandbox.

    Arguments:
        wasm: the component, as a path or as its bytes.
        config: the trial's hyperparameters (a JSON-serializable dict),
            passed to the guest's ``setup``; ``{}`` when omitted. With
            ``restore``, a checkpoint of another configuration is switched
            to it (the guest's ``reset``); omitted, the checkpoint's own
            configuration goes on.
        experiment: an experiment file (``experiment.toml``) whose trial
            settings apply; its relative paths start at its directory.
        limits, data, compute, checkpoint, security, snapshot_key_file:
            the experiment file's keys of the same names, over the file's
            (``limits`` and ``data`` merge key by key). Paths given here
            are relative to the current directory.
        trial_dir: where the trial's files go (``stdout.log``,
            ``stderr.log``, ``guest.log``; the guest's own directory is
            ``trial_dir/work``). A temporary directory when omitted.
        trial_id: the trial's name in its checkpoints.
        restore: a checkpoint (path or bytes) to start from instead of
            ``setup``.
        gpu: the GPU host compute runs the trial's kernels on: its number
            among host compute's GPUs (``0``, ``1``, ...) or its PCI
            address (``"0000:19:00.0"``, as ``nvidia-smi
            --query-gpu=pci.bus_id`` prints it). The first when omitted;
            unused by a component that does not import host compute.

    Raises `ConfigError` for bad settings, `ComponentError` for a
    component that cannot run, and a `TrialError` when ``setup`` (or the
    restore) fails.
    """

    def __init__(
        self,
        wasm: Union[PathLike, bytes],
        config: Mapping[str, Any] | None = None,
        *,
        experiment: PathLike | None = None,
        limits: Mapping[str, Any] | None = None,
        data: Mapping[str, PathLike] | None = None,
        compute: str | None = None,
        checkpoint: str | None = None,
        security: Mapping[str, Any] | None = None,
        snapshot_key_file: PathLike | None = None,
        trial_dir: PathLike | None = None,
        trial_id: str | None = None,
        restore: Union[PathLike, bytes, None] = None,
        gpu: Union[int, str, None] = None,
    ) -> None:
        settings, base = trial_settings(
            experiment,
            limits=limits,
            data=data,
            compute=compute,
            checkpoint=checkpoint,
            security=security,
            snapshot_key_file=snapshot_key_file,
        )
        self._start(wasm, config, settings, base, trial_dir, trial_id, restore, gpu=gpu)

    @classmethod
    def from_settings(
        cls,
        wasm: Union[PathLike, bytes],
        config: Mapping[str, Any] | None,
        settings: Mapping[str, Any],
        base_dir: PathLike,
        *,
        trial_dir: PathLike | None = None,
        trial_id: str | None = None,
        restore: Union[PathLike, bytes, None] = None,
        deferred: bool = False,
        gpu: Union[int, str, None] = None,
    ) -> "Trainable":
        """A trainable from trial settings already gathered (the experiment
        file's keys of `TRIAL_KEYS`, relative paths from ``base_dir``), as
        `wtune.ray` ships them to Ray's workers. With ``deferred`` the
        component is compiled now but the guest's ``setup`` runs only at
        the first call that needs an instance, so a `restore` that comes
        first (a Ray trial recovered on another node) skips it."""
        trainable = cls.__new__(cls)
        trainable._start(
            wasm, config, dict(settings), Path(base_dir), trial_dir, trial_id, restore, deferred, gpu
        )
        return trainable

    def _start(
        self, wasm, config, settings, base, trial_dir, trial_id, restore, deferred=False, gpu=None
    ) -> None:
        if isinstance(wasm, (bytes, bytearray, memoryview)):
            wasm_path, wasm_bytes = None, bytes(wasm)
        else:
            wasm_path, wasm_bytes = os.fspath(wasm), None
        with _checkpoint_file(restore) as restore_path:
            self._native = _native.Trainable(
                wasm_path,
                wasm_bytes,
                None if config is None else _to_json(dict(config), "config"),
                json.dumps(settings),
                str(base),
                None if trial_dir is None else os.fspath(trial_dir),
                trial_id,
                restore_path,
                deferred,
                None if gpu is None else str(gpu),
            )

    def train(self) -> dict:
        """Runs one training iteration; returns the guest's metrics plus
        ``training_iteration``, ``done``, ``fuel_this_iter``, ``fuel_total``,
        ``time_this_iter_s`` and ``time_total_s``."""
        return self._native.train()

    def save(self, path: PathLike | None = None) -> Union[int, bytes]:
        """Checkpoints the trial: a host snapshot of the guest's memory (or
        the guest's own ``save()`` with ``checkpoint="guest"``). With
        ``path`` the file is written there atomically and its size
        returned; without, the checkpoint's bytes are returned."""
        if path is not None:
            return self._native.save_to(os.fspath(path))
        with tempfile.TemporaryDirectory(prefix="wtune-save-") as scratch:
            file = Path(scratch) / "checkpoint.wtsnap"
            self._native.save_to(str(file))
            return file.read_bytes()

    def restore(
        self, checkpoint: Union[PathLike, bytes], config: Mapping[str, Any] | None = None
    ) -> None:
        """Continues from ``checkpoint`` (a path or the bytes ``save()``
        returned). A checkpoint of another trial continues with ``config``
        when given (the guest's ``reset`` switches it, as a PBT exploit
        does), else with the checkpoint's own configuration. The running
        instance is replaced only once the restored one runs."""
        config_json = None if config is None else _to_json(dict(config), "config")
        with _checkpoint_file(checkpoint) as path:
            self._native.restore_from(path, config_json)

    def restart(
        self,
        config: Mapping[str, Any],
        *,
        deferred: bool = False,
        trial_dir: Union[str, "os.PathLike[str]", None] = None,
        trial_id: str | None = None,
    ) -> None:
        """Starts a new trial with ``config`` in a fresh instance of the
        same compiled component (``setup`` runs again; nothing learned is
        kept). The running instance is replaced once the new one is set
        up; with ``deferred`` it is closed now, and the new one is set up
        at the first call that needs it (a `restore` first skips that).
        ``trial_dir`` and ``trial_id``, when given, are the new trial's: its
        files (its guest's directory is ``trial_dir/work``) go there rather
        than among the old trial's; by default they stay the same."""
        self._native.restart(
            _to_json(dict(config), "config"),
            deferred,
            None if trial_dir is None else os.fspath(trial_dir),
            trial_id,
        )

    def reset(self, config: Mapping[str, Any]) -> bool:
        """Switches to ``config`` in place with the guest's ``reset()``,
        keeping what it learned; ``False`` when the guest has no reset (then
        nothing changed)."""
        return self._native.reset(_to_json(dict(config), "config"))

    def close(self) -> None:
        """Lets the guest release its resources (``cleanup()``). Closing
        twice is harmless; a closed trainable can still be restored."""
        self._native.close()

    def __enter__(self) -> "Trainable":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def iteration(self) -> int:
        """Completed training iterations, a restored checkpoint's included."""
        return self._native.iteration

    @property
    def fuel_total(self) -> int:
        """Fuel burned so far, start-up and restored checkpoint included."""
        return self._native.fuel_total

    @property
    def config(self) -> dict:
        """The configuration the trial runs with."""
        return json.loads(self._native.config_json)

    @property
    def digest(self) -> str:
        """The component's blake3 digest (``security.allowed_components``)."""
        return self._native.digest

    @property
    def checkpoint_mode(self) -> str:
        """``"snapshot"`` (host-taken) or ``"guest"`` (the guest's save)."""
        return self._native.checkpoint_mode

    @property
    def gpu(self) -> int | None:
        """The number of the GPU host compute runs the trial's kernels on;
        ``None`` for the first, or where the component uses no host
        compute."""
        return self._native.gpu

    @property
    def trial_dir(self) -> Path:
        """The trial's directory (logs here; the guest's files in ``work/``)."""
        return Path(self._native.trial_dir)


def _to_json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{what} must be JSON (numbers, strings, booleans, lists, dicts): {e}") from None


class _checkpoint_file:
    """A checkpoint given as a path stays where it is; one given as bytes
    is written to a temporary file for as long as it is read."""

    def __init__(self, checkpoint: Union[PathLike, bytes, None]) -> None:
        self._checkpoint = checkpoint
        self._scratch: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> str | None:
        checkpoint = self._checkpoint
        if checkpoint is None:
            return None
        if isinstance(checkpoint, (bytes, bytearray, memoryview)):
            self._scratch = tempfile.TemporaryDirectory(prefix="wtune-restore-")
            file = Path(self._scratch.name) / "checkpoint.wtsnap"
            file.write_bytes(bytes(checkpoint))
            return str(file)
        return os.fspath(checkpoint)

    def __exit__(self, *exc: object) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()
