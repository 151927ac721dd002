"""Look inside attention: capture, statistics, rollout, head importance, pictures, report.

from attnlab.inspect import capture_attention, AttentionAnalyzer

with capture_attention(model) as captured:
    model(ids)
captured.attentions["layer_1"]          # [B, H, T, T], eval mode, per head

Three rooms: :mod:`~attnlab.inspect.compute` (what computes: capture, statistics,
rollout, head importance, the analyzer, image alignment), :mod:`~attnlab.inspect.draw`
(what draws: plots and HTML pages, matplotlib ``Figure`` on the Agg canvas) and
:mod:`~attnlab.inspect.commands` (what ``attnlab inspect``, ``analyze`` and
``image-attention`` do). The computing names are importable from here.
"""

from .compute.analyzer import AttentionAnalyzer, AttentionStatistics, EvaluationResult
from .compute.batches import AnalysisBatch, as_analysis_batch
from .compute.capture import AttentionCapture, capture_attention, find_attention_modules
from .compute.heads import head_importance, head_mask_from, mask_heads
from .compute.attention_flow import attention_flow
from .compute.attention_scores import raw_attention_scores, rollout_scores
from .compute.gradient_rollout import attention_gradients, gradient_weighted_rollout
from .compute.integrated_gradients import integrated_gradients
from .compute.patching import PatchResult, head_patching_sweep, layer_patching_sweep, patch_heads, patch_layers
from .compute.rollout import attention_rollout
from .compute.token_attribution import METHODS, TokenAttributions, attribute_tokens
from .compute.statistics import HeadStatistics, neighbour_alignment, row_statistics

__all__ = [
    "METHODS",
    "PatchResult",
    "TokenAttributions",
    "attention_flow",
    "attention_gradients",
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
    "AttentionStatistics",
    "EvaluationResult",
    "HeadStatistics",
    "as_analysis_batch",
    "attention_rollout",
    "capture_attention",
    "find_attention_modules",
    "head_importance",
    "head_mask_from",
    "mask_heads",
    "neighbour_alignment",
    "row_statistics",
]
