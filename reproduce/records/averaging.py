"""Checkpoint averaging (section 6.1, Table 2): base averages the last 5 checkpoints, big the last 20.

Checkpoints are Lightning's (weights under ``ckpt["state_dict"]``, named ``step<N>.ckpt`` by the
runner's ModelCheckpoint) or plain state-dict files. Averaging keeps the keys as saved, so a
Lightning module's ``state_dict`` loads the result directly.
"""

from __future__ import annotations

from pathlib import Path

import torch


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The weights in one checkpoint: Lightning's ``state_dict`` entry, or the file itself."""
    # weights_only: a checkpoint is a pickle; Lightning's hold only plain types, which it accepts.
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    weights = ckpt.get("state_dict", ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        raise ValueError(f"{path}: not a state dict or a Lightning checkpoint with a 'state_dict'")
    return weights


def _check_same_layout(path: Path, weights: dict[str, torch.Tensor],
                       first: dict[str, torch.Tensor], first_path: Path) -> None:
    """Raise ValueError naming `path` where its keys or shapes differ from the first checkpoint's."""
    missing, extra = sorted(first.keys() - weights.keys()), sorted(weights.keys() - first.keys())
    if missing or extra:
        raise ValueError(f"{path}: keys differ from {first_path}: missing {missing}, unexpected {extra}")
    for key, tensor in weights.items():
        if tensor.shape != first[key].shape:
            raise ValueError(f"{path}: {key} has shape {tuple(tensor.shape)}, "
                             f"{first_path} has {tuple(first[key].shape)}")


def average_checkpoints(paths: list[Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the weights in `paths`, accumulated in float64 and cast back to each
    tensor's dtype (the first checkpoint's); integer and bool buffers come from the last checkpoint.

    One checkpoint is in memory at a time besides the float64 sums."""
    if not paths:
        raise ValueError("no checkpoints to average")
    paths = [Path(p) for p in paths]
    first = load_weights(paths[0])
    # Integer and bool buffers (counters, masks) have no meaningful or representable mean.
    sums = {k: t.double() for k, t in first.items() if t.is_floating_point()}
    last = first
    for path in paths[1:]:
        last = load_weights(path)
        _check_same_layout(path, last, first, paths[0])
        for key in sums:
            sums[key] += last[key].double()
    return {key: (sums[key] / len(paths)).to(tensor.dtype) if key in sums else last[key]
            for key, tensor in first.items()}

