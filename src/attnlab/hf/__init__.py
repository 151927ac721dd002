"""Look inside any transformers model: attnlab as transformers' attention backend.

``transformers`` is needed only here (an optional extra for the rest of attnlab)::

    import attnlab.hf

    with attnlab.hf.attach(model, layers=[2, 5]) as seen:   # exact weights on layers 2 and 5
        out = model(**batch)                                 # every other layer: fused sdpa
    seen.attentions["layer_2"]                               # [B, H, T, S]

Every attention module whose model calls ``transformers.AttentionInterface`` is served
(self, causal, sliding-window, soft-capped, sink and cross-attention); see
:func:`attach` for statistics without the maps, gradients and head masks.
"""

from .attribution import TransformersClassifier, explain_tokens
from .backend import AttachedModel, attach
from .generation import generate
from .patching import head_patching_sweep, patch_heads
from ._kernel import BACKEND_NAME, UnsupportedAttention, attnlab_attention_forward
from ._sites import AttentionSite, attention_sites

__all__ = [
    "AttachedModel",
    "AttentionSite",
    "BACKEND_NAME",
    "TransformersClassifier",
    "UnsupportedAttention",
    "attach",
    "attention_sites",
    "attnlab_attention_forward",
    "explain_tokens",
    "generate",
    "head_patching_sweep",
    "patch_heads",
]
