"""Which GPU a CUDA device number names, for host compute.

Schedulers (Ray among them) hand a process CUDA device numbers, while host
compute runs on Vulkan, which ignores ``CUDA_VISIBLE_DEVICES`` and numbers
GPUs its own way. The PCI address is the name both agree on.
"""

from __future__ import annotations

import subprocess
from typing import Union

from ._native import ConfigError


def pci_address(device: Union[int, str]) -> str:
    """The PCI address of CUDA device ``device`` of this machine (an index,
    or a UUID where ``CUDA_VISIBLE_DEVICES`` names devices so), as
    ``nvidia-smi`` prints it: pass it as ``wtune.Trainable(..., gpu=...)``.
    CUDA numbers a machine's alike GPUs in nvidia-smi's (PCI bus) order.

    Raises `ConfigError` when nvidia-smi cannot run or does not list the
    device."""
    query = ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"]
    try:
        listing = subprocess.run(query, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ConfigError(
            f"GPU {device} was given to this trial, but nvidia-smi cannot say which device that is "
            f"({e}), so host compute cannot run on it; set compute = \"cpu\" or request no GPU"
        ) from None
    for line in listing.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 3 and str(device) in parts[:2]:
            return parts[2]
    raise ConfigError(f"GPU {device} was given to this trial, but nvidia-smi does not list it:\n{listing}")
