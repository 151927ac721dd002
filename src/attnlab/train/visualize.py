"""One head's attention map, computed in eval mode and drawn headless.

Python arguments are 0-based indices (``layer_idx=0`` is the first layer); everything
drawn for people (titles) counts layers and heads from 1, as every attnlab report does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor, nn

from ..data.padding import model_pad_id

__all__ = ["attention_figure", "attention_map", "map_title", "save_attention_map"]


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
        raise ValueError(
            f"layer_idx={layer_idx} is out of range: 0-based indices 0..{len(attentions) - 1} "
            f"(layers 1..{len(attentions)})"
        )
    weights = attentions[layer_key]  # [1, H, T, T]
    if not 0 <= head_idx < weights.shape[1]:
        raise ValueError(
            f"head_idx={head_idx} is out of range: 0-based indices 0..{weights.shape[1] - 1} "
            f"(heads 1..{weights.shape[1]})"
        )
    attn = weights[0, head_idx].float().cpu().numpy()
    pad_id = model_pad_id(model)
    if pad_id is not None:
        length = int((input_sequence[0] != pad_id).sum())
        attn = attn[:length, :length]
    return attn


def map_title(layer_idx: int, head_idx: int, text: str = "") -> str:
    """``"Layer 1, head 1"`` for 0-based indices ``(0, 0)``, and the text if given."""
    title = f"Layer {layer_idx + 1}, head {head_idx + 1}"
    return f"{title}: {text}" if text else title


def attention_figure(attn: np.ndarray, *, title: str = "", tokens: Optional[Sequence[str]] = None):
    """``attn`` as a heatmap on a ``matplotlib.figure.Figure`` with the Agg canvas (no
    display, no pyplot state). With ``tokens`` (one per row of ``attn``) both axes are
    labelled with them; otherwise with positions."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if tokens is not None:
        tokens = [str(token) for token in tokens]
        if len(tokens) != attn.shape[0] or len(tokens) != attn.shape[1]:
            raise ValueError(f"tokens has {len(tokens)} entries for a {attn.shape[0]} x {attn.shape[1]} map")
    figure = Figure(figsize=(6, 5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(attn, cmap="viridis", vmin=0.0, aspect="equal")
    figure.colorbar(image, ax=axes)
    axes.set_title(title)
    if tokens is not None:
        size = 8 if len(tokens) <= 24 else 6
        axes.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=size)
        axes.set_yticks(range(len(tokens)), tokens, fontsize=size)
        axes.set_xlabel("Keys (attended to)")
        axes.set_ylabel("Queries (attending)")
    else:
        axes.set_xlabel("Key positions")
        axes.set_ylabel("Query positions")
    figure.tight_layout()
    return figure


def save_attention_map(
    attn: np.ndarray, path: Union[str, Path], *, title: str = "", tokens: Optional[Sequence[str]] = None
) -> Path:
    """Write :func:`attention_figure` of ``attn`` as a PNG."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    attention_figure(attn, title=title, tokens=tokens).savefig(path, dpi=100)
    return path
