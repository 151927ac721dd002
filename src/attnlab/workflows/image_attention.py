"""Where a trained image–text model looks: its text-token -> patch attention drawn over the
digits task's images (:func:`draw_examples`, one PNG per example and cross-modal layer), and
the inspection summary page of the alignment scores (:func:`write_html_summary`). What
``attnlab image-attention`` writes."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from ..data.digits_text import DigitsTextExample, collate_digits_text
from ..inspect.compute.image_alignment import ink_patches
from ..inspect.draw.image_attention import plot_text_to_image_attention
from ..inspect.draw.report import render_summary

__all__ = ["ALIGNMENT_DESCRIPTIONS", "draw_examples", "write_html_summary"]

ALIGNMENT_DESCRIPTIONS = {
    "alignment_score": "mass the statement's tokens put on inked patches (the reference)",
    "alignment_argmax": "how often a token's most attended patch is inked",
}


def write_html_summary(path, alignment: dict[str, dict], images: dict[str, Path], *, meta: dict) -> Path:
    """The inspection summary page: per-head alignment tables and the PNGs, inlined."""
    layers = list(alignment)
    tables = {statistic: [alignment[layer]["heads"][statistic] for layer in layers]
              for statistic in ("alignment_score", "alignment_argmax")}
    chance = next(iter(alignment.values()))["chance"] if alignment else 0.0
    meta = {**meta, "reference": f"patches with ink; uniform attention would put {chance:.3f} of its mass there"}
    page = render_summary(tables, layers, title="attnlab: text-token to image-patch attention", meta=meta,
                          images={caption: image for caption, image in images.items()},
                          descriptions=ALIGNMENT_DESCRIPTIONS)
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path


@torch.no_grad()
def draw_examples(model, tokenizer, examples: Sequence[DigitsTextExample], out_dir, *,
                  layer: str = "layer_1") -> list[Path]:
    """One PNG per example: ``layer``'s text-token -> patch attention over its image."""
    model.eval()
    out_dir = Path(out_dir)
    paths = []
    batch = collate_digits_text(examples, tokenizer)
    out = model(batch["input_ids"], batch["mask"], images=batch["images"], output_attentions=True)
    if not out.cross_attentions:
        raise ValueError("the model has no cross-modal attention to draw (fusion='concat'?)")
    if layer not in out.cross_attentions:
        raise ValueError(f"layer must be one of {sorted(out.cross_attentions)}, got {layer!r}")
    probabilities = out.logits.softmax(-1)[:, 1]
    for row, example in enumerate(examples):
        length = int(batch["mask"][row].sum())
        tokens = tokenizer.encode(example.text).tokens[:length]
        weights = out.cross_attentions[layer][row, :, :length]  # [H, T, S]
        verdict = "true" if example.label else "false"
        title = (f'"{example.text}" (digit {example.digit}; {verdict}, '
                 f"model says true with p={float(probabilities[row]):.2f}) {layer}")
        path = out_dir / f"example_{row:02d}_{layer}.png"
        plot_text_to_image_attention(torch.from_numpy(example.image), weights, tokens, path,
                                     patch_size=model.config.patch_size, title=title,
                                     reference=ink_patches(torch.from_numpy(example.image), model.config.patch_size))
        paths.append(path)
    return paths
