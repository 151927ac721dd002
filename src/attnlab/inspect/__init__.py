"""Look inside attention: capture, statistics, rollout, head importance, pictures, report.

from attnlab.inspect import capture_attention, AttentionAnalyzer

with capture_attention(model) as captured:
    model(ids)
captured.attentions["layer_1"]          # [B, H, T, T], eval mode, per head
"""

from .analyzer import AttentionAnalyzer, AttentionStatistics, EvaluationResult
from .batches import AnalysisBatch, as_analysis_batch
from .capture import AttentionCapture, capture_attention, find_attention_modules
from .heads import head_importance, head_mask_from, mask_heads
from .rollout import attention_rollout
from .statistics import HeadStatistics, neighbour_alignment, row_statistics

__all__ = [
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
