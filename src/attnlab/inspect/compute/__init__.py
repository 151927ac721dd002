"""What computes: attention capture, per-head statistics, rollout, head masking and
importance, the dataset-level analyzer, and text-to-image alignment.

One concept a module: ``capture`` (hooks that collect the weights), ``batches`` (the
batch forms the analyzer takes), ``statistics`` (per-row definitions and streaming
means), ``rollout``, ``heads`` (masking and importance), ``analyzer``
(``AttentionAnalyzer``), ``token_groups`` (``[CLS]``/``[SEP]``/punctuation ids) and
``image_alignment`` (text -> patch attention against the ink); attribution, one method a
module (``attention_scores``: raw and rollout rows, ``attention_flow``,
``gradient_rollout``: Chefer et al.'s two rules, ``lrp`` with ``lrp_rules``: the LRP
relevance of each attention map that their ``relevance`` rule weights,
``integrated_gradients``), tied together
by ``token_attribution`` with ``attribution_target`` (the pooled position, the class);
``patching`` (activation patching of heads and layers).
"""

from .analyzer import AttentionAnalyzer, AttentionStatistics, EvaluationResult
from .comparison import compare_statistics
from .batches import AnalysisBatch, as_analysis_batch
from .capture import AttentionCapture, capture_attention, find_attention_modules
from .heads import default_loss, forward_batch, head_importance, head_mask_from, mask_heads
from .attention_flow import attention_flow
from .attention_scores import raw_attention_scores, rollout_scores
from .gradient_rollout import attention_gradients, gradient_weighted_rollout
from .integrated_gradients import integrated_gradients
from .lrp import AttentionRelevance, attention_relevance
from .patching import PatchResult, head_patching_sweep, layer_patching_sweep, patch_heads, patch_layers
from .rollout import attention_rollout
from .token_attribution import METHODS, TokenAttributions, attribute_tokens
from .statistics import BASE_STATISTICS, HeadStatistics, neighbour_alignment, row_statistics
from .token_groups import special_token_groups

__all__ = [
    "METHODS",
    "PatchResult",
    "TokenAttributions",
    "attention_flow",
    "compare_statistics",
    "attention_gradients",
    "attention_relevance",
    "attribute_tokens",
    "gradient_weighted_rollout",
    "head_patching_sweep",
    "integrated_gradients",
    "layer_patching_sweep",
    "patch_heads",
    "patch_layers",
    "raw_attention_scores",
    "rollout_scores",
    "AnalysisBatch",
    "AttentionAnalyzer",
    "AttentionCapture",
    "AttentionRelevance",
    "AttentionStatistics",
    "BASE_STATISTICS",
    "EvaluationResult",
    "HeadStatistics",
    "as_analysis_batch",
    "attention_rollout",
    "capture_attention",
    "default_loss",
    "find_attention_modules",
    "forward_batch",
    "head_importance",
    "head_mask_from",
    "mask_heads",
    "neighbour_alignment",
    "row_statistics",
    "special_token_groups",
]
