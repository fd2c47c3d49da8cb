"""``--device``, the same for every subcommand that computes: CUDA when torch sees a CUDA device, else the CPU;
a device that is not there is one line, before any work."""
from __future__ import annotations

import argparse
from typing import Optional

DEVICE_HELP = ("torch device: cpu, cuda or cuda:N (default: cuda when torch sees a CUDA device, else cpu; "
               "the same rule for every asrkit command)")


class DeviceError(ValueError):
    """The device named by --device does not exist here."""


def add_device_option(p: argparse.ArgumentParser, extra_help: str = "") -> None:
    """``--device`` with the common default rule (resolved by :func:`resolve_device`)."""
    p.add_argument("--device", help=DEVICE_HELP + (f"; {extra_help}" if extra_help else ""))


def resolve_device(device: Optional[str]) -> str:
    """The device to use: ``device`` checked, or the default rule when it is None. Raises DeviceError (one
    line) for a malformed name, CUDA on a machine without a CUDA device, or a CUDA index beyond the count."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise DeviceError(f"--device {device}: not a device name (cpu, cuda or cuda:N)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"--device {device}: no CUDA device is available (torch sees none; use --device cpu)")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            have = "there is only 1 CUDA device (cuda:0)" if count == 1 else \
                f"there are only {count} CUDA devices (cuda:0 .. cuda:{count - 1})"
            raise DeviceError(f"--device {device}: {have}")
    elif dev.type != "cpu":
        raise DeviceError(f"--device {device}: asrkit runs on cpu or cuda devices, not {dev.type}")
    return device
