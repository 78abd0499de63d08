"""The experiment file's keys that apply to one trial, merged from an
experiment file and keyword arguments into the object the native module
checks as ``wtune run`` checks a file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from ._native import ConfigError, check_experiment_keys

#: The experiment file's keys a single trial uses.
TRIAL_KEYS = ("limits", "data", "compute", "checkpoint", "security", "snapshot_key_file")


def read_experiment(path: "os.PathLike[str] | str") -> dict:
    """The experiment file at ``path`` as a dict; `ConfigError` when it
    cannot be read or is not TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config {os.fspath(path)}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{os.fspath(path)}: {e}") from None


def trial_settings(
    experiment: "os.PathLike[str] | str | None",
    **keys: Any,
) -> tuple[dict, Path]:
    """The trial keys of ``experiment`` (a file) with ``keys`` over them,
    and the directory relative paths start from. Paths in ``keys`` are made
    absolute (they are relative to the current directory, the file's to its
    own); ``None`` values are left out."""
    unknown = sorted(set(keys) - set(TRIAL_KEYS))
    if unknown:
        raise ConfigError(f"unknown trial settings {unknown}; expected some of {list(TRIAL_KEYS)}")
    settings: dict = {}
    base = Path.cwd()
    if experiment is not None:
        file = read_experiment(experiment)
        # Only the trial keys are kept: a misspelt one (`[limts]`) would
        # otherwise be dropped without a word. The others are only read,
        # not planned (a `restore_from` need not exist on this machine).
        check_experiment_keys(os.fspath(experiment))
        settings = {k: v for k, v in file.items() if k in TRIAL_KEYS}
        base = Path(experiment).resolve().parent
    for key, value in keys.items():
        if value is None:
            continue
        if key == "data":
            value = _absolute_paths(value, "data")
        elif key == "snapshot_key_file":
            value = str(Path(os.fspath(value)).resolve())
        if isinstance(value, Mapping) and isinstance(settings.get(key), Mapping):
            settings[key] = {**settings[key], **value}
        elif isinstance(value, Mapping):
            settings[key] = dict(value)
        else:
            settings[key] = value
    return settings, base


def _absolute_paths(grants: Any, key: str) -> dict:
    if not isinstance(grants, Mapping):
        raise ConfigError(f"{key} must be a dict of name -> directory, got {grants!r}")
    return {name: str(Path(os.fspath(dir)).resolve()) for name, dir in grants.items()}
