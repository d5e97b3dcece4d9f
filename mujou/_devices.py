"""Checking and pinning the ``device`` argument of a node."""

from __future__ import annotations

import torch

_ALLOWED = "'cpu', 'cuda' or 'cuda:N'"


def parse_device(device: object) -> torch.device:
    """Return ``device`` as a ``torch.device`` that is the CPU or an available CUDA device.

    ``"cuda"`` without an index is pinned to the host's current CUDA device now, when the
    node is made (see :ref:`cuda.index-pinned`).

    Raises:
        TypeError: ``device`` is neither a str nor a torch.device.
        ValueError: it names another kind of device, or CUDA where CUDA is not available.
    """
    if isinstance(device, str):
        try:
            parsed = torch.device(device)
        except RuntimeError:
            raise ValueError(f"device must be {_ALLOWED}, got {device!r}") from None
    elif isinstance(device, torch.device):
        parsed = device
    else:
        raise TypeError(
            f"device must be a str or a torch.device ({_ALLOWED}), got {type(device).__name__}: {device!r}"
        )
    if parsed.type == "cpu":
        return torch.device("cpu")
    if parsed.type != "cuda":
        raise ValueError(f"device must be {_ALLOWED}, got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {device!r} is a CUDA device, but CUDA is not available here "
            f"(torch {torch.__version__}); use device='cpu'"
        )
    given: int | None = parsed.index  # None for "cuda": pinned to the current device now
    index = torch.cuda.current_device() if given is None else given
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise ValueError(f"device {device!r} does not exist: this machine has {count} CUDA device(s)")
    return torch.device("cuda", index)
