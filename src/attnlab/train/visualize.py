"""One head's attention map, computed in eval mode and drawn headless."""

from __future__ import annotations

from pathlib import Path
from typing import Union

import numpy as np
import torch
from torch import Tensor, nn

from ..data.padding import model_pad_id

__all__ = ["attention_map", "save_attention_map"]


def attention_map(model: nn.Module, input_sequence: Tensor, layer_idx: int = 0, head_idx: int = 0) -> np.ndarray:
    """The ``[T, T]`` weights of head ``head_idx`` in layer ``layer_idx`` (0-based) for the
    first sequence of ``input_sequence``, cut to its real tokens when the model knows its
    ``pad_id``. Runs in eval mode (no dropout on the weights) and restores the model's mode.

    Shape:
        ``input_sequence`` ``[T]`` or ``[B, T]`` token ids -> ``[T', T']`` numpy array.
    """
    if not isinstance(input_sequence, Tensor):
        raise TypeError(f"input_sequence must be a torch.Tensor, got {type(input_sequence).__name__}")
    if input_sequence.dim() == 1:
        input_sequence = input_sequence.unsqueeze(0)  # [1, T]
    if input_sequence.dim() != 2:
        raise ValueError(f"input_sequence must be [T] or [B, T], got shape {tuple(input_sequence.shape)}")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            output = model(input_sequence[:1].to(device), output_attentions=True)
    finally:
        model.train(was_training)
    attentions = output.attentions if hasattr(output, "attentions") else output[1]
    layer_key = f"layer_{layer_idx + 1}"
    if layer_key not in attentions:
        raise ValueError(f"layer_idx={layer_idx} is out of range: the model has layers 0..{len(attentions) - 1}")
    weights = attentions[layer_key]  # [1, H, T, T]
    if not 0 <= head_idx < weights.shape[1]:
        raise ValueError(f"head_idx={head_idx} is out of range: the model has heads 0..{weights.shape[1] - 1}")
    attn = weights[0, head_idx].float().cpu().numpy()
    pad_id = model_pad_id(model)
    if pad_id is not None:
        length = int((input_sequence[0] != pad_id).sum())
        attn = attn[:length, :length]
    return attn


def save_attention_map(attn: np.ndarray, path: Union[str, Path], *, title: str = "") -> Path:
    """Write ``attn`` as a heatmap PNG with the Agg canvas (no display, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure = Figure(figsize=(6, 5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(attn, cmap="viridis", vmin=0.0, aspect="equal")
    figure.colorbar(image, ax=axes)
    axes.set_title(title)
    axes.set_xlabel("Key positions")
    axes.set_ylabel("Query positions")
    figure.savefig(path, dpi=100)
    return path
