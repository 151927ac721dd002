"""What computes: attention capture, per-head statistics, rollout, head masking and
importance, the dataset-level analyzer, and text-to-image alignment.

One concept a module: ``capture`` (hooks that collect the weights), ``batches`` (the
batch forms the analyzer takes), ``statistics`` (per-row definitions and streaming
means), ``rollout``, ``heads`` (masking and importance), ``analyzer``
(``AttentionAnalyzer``), ``token_groups`` (``[CLS]``/``[SEP]``/punctuation ids) and
``image_alignment`` (text -> patch attention against the ink).
"""

from .analyzer import AttentionAnalyzer, AttentionStatistics, EvaluationResult
from .batches import AnalysisBatch, as_analysis_batch
from .capture import AttentionCapture, capture_attention, find_attention_modules
from .heads import default_loss, forward_batch, head_importance, head_mask_from, mask_heads
from .rollout import attention_rollout
from .statistics import BASE_STATISTICS, HeadStatistics, neighbour_alignment, row_statistics
from .token_groups import special_token_groups

__all__ = [
    "AnalysisBatch",
    "AttentionAnalyzer",
    "AttentionCapture",
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
