"""Activation patching of heads on a transformers model: attnlab's one implementation.

:func:`~attnlab.inspect.patch_heads` and :func:`~attnlab.inspect.head_patching_sweep`
serve every model through the inspection protocol; on a transformers model a head's
output is its ``[B, T, D]`` slice of what attnlab's attention function returns (before the
output projection mixes the heads), recorded and replaced there: no model code is touched.
They take ``input_ids`` or the model's keyword inputs (``{"pixel_values": ...}``).
"""

from __future__ import annotations

from ..inspect.compute.patching import head_patching_sweep, patch_heads

__all__ = ["patch_heads", "head_patching_sweep"]
