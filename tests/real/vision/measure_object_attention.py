"""Where DINOv2-small's class token looks: the horse's share of its last-layer attention (each
head, the heads' mean, the rollout) against the horse's share of the area, on every scene of
:mod:`scenes`, for the real backbone and for a random one of the same shape.

``python measure_object_attention.py DINO_DIR`` prints the table (``DINO_DIR`` as
``convert_dinov2.py`` writes it); the tests call :func:`measure`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from scenes import POSITIONS, SIZES, TEXTURES, Scene, horse_scene


def scenes(textures=TEXTURES) -> list[Scene]:
    return [horse_scene(texture, position, size) for texture in textures for position in POSITIONS for size in SIZES]


def measure(model, preprocessing, scene: Scene):
    """``(ObjectShare, ImageAttention)`` of one scene."""
    from attnlab.hf.vision import attention_share, image_attention

    seen = image_attention(model, preprocessing(scene.image))
    return attention_share(seen, scene.mask), seen


def table(model, preprocessing, chosen: list[Scene]) -> list[str]:
    lines = ["scene | area | per head | fused | rollout | artifact tokens (row, col, norm / median, attention x G)"]
    for scene in chosen:
        share, seen = measure(model, preprocessing, scene)
        heads = " ".join(f"{float(value):.3f}" for value in share.per_head)
        found = seen.artifact_tokens()
        artifacts = ", ".join(f"({a.row}, {a.column}, {a.norm_ratio:.2f}, {a.attention_ratio:.2f})" for a in found)
        ratio = float(seen.patch_norms.max() / seen.patch_norms.median())
        lines.append(f"{scene.name} | {share.area:.3f} | {heads} | {share.fused:.3f} | {share.rollout:.3f} | "
                     f"{artifacts or 'none'} (largest norm {ratio:.2f} x median)")
    return lines


def main(arguments: list[str]) -> int:
    import torch
    from transformers import Dinov2Model

    from attnlab.data.images import read_image_preprocessing

    if len(arguments) != 1:
        print("usage: python measure_object_attention.py DINO_DIR", file=sys.stderr)
        return 2
    directory = Path(arguments[0])
    real = Dinov2Model.from_pretrained(directory).eval()
    preprocessing = read_image_preprocessing(directory)
    torch.manual_seed(0)
    random = Dinov2Model(real.config).eval()
    chosen = scenes()
    for title, model in (("real DINOv2-small", real), ("random Dinov2Model, seed 0", random)):
        print(f"# {title}: the horse's share of the class token's last-layer attention")
        print("\n".join(table(model, preprocessing, chosen)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
