"""Look inside attention: capture, statistics, rollout, head importance, pictures, report.

from attnlab.inspect import capture_attention, AttentionAnalyzer

with capture_attention(model) as captured:
    model(ids)
captured.attentions["layer_1"]          # [B, H, T, T], eval mode, per head

Two rooms: :mod:`~attnlab.inspect.compute` (what computes: capture, statistics,
rollout, head importance, the analyzer, image alignment) and :mod:`~attnlab.inspect.draw`
(what draws: plots and HTML pages, matplotlib ``Figure`` on the Agg canvas). What the
commands do with them (a model loaded, outputs written) is :mod:`attnlab.workflows`, a
floor above. The computing names are importable from here, and so are ``explain`` /
``Explanation`` and ``compare_models`` / ``Comparison`` and ``explain_generation`` /
``GenerationExplanation`` (results that show themselves in notebooks; they live in
:mod:`attnlab.workflows`), imported when first used so that ``import attnlab`` does not
load matplotlib.
"""

from .._moved import moved_names

from .compute.analyzer import AttentionAnalyzer, AttentionStatistics, EvaluationResult
from .compute.batches import AnalysisBatch, as_analysis_batch
from .compute.capture import AttentionCapture, capture_attention, find_attention_modules
from .compute.heads import head_importance, head_mask_from, mask_heads
from .compute.inspectable import FEATURES, Inspectable, NotOffered, Site, inspectable
from .compute.attention_flow import attention_flow
from .compute.attention_scores import raw_attention_scores, rollout_scores
from .compute.gradient_rollout import attention_gradients, gradient_weighted_rollout
from .compute.integrated_gradients import integrated_gradients
from .compute.lrp import AttentionRelevance, attention_relevance
from .compute.patching import PatchResult, head_patching_sweep, layer_patching_sweep, patch_heads, patch_layers
from .compute.rollout import attention_rollout
from .compute.token_attribution import METHODS, TokenAttributions, attribute_tokens
from .compute.statistics import HeadStatistics, neighbour_alignment, row_statistics
from .compute.generation_attribution import GENERATION_METHODS, GenerationAttributions, attribute_generation
from .compute.head_roles import HEAD_ROLES, HeadRoles, find_head_roles, head_role_scores
from .compute.logit_lens import LogitLens, logit_lens

# explain / Explanation, compare_models / Comparison and explain_generation /
# GenerationExplanation live in attnlab.workflows, a floor above; handed out from here through
# attnlab._moved when first asked for (they load models, data and pages)
__getattr__ = moved_names(__name__)


__all__ = [
    "FEATURES",
    "Inspectable",
    "NotOffered",
    "Site",
    "inspectable",
    "GENERATION_METHODS",
    "GenerationAttributions",
    "GenerationExplanation",
    "HEAD_ROLES",
    "HeadRoles",
    "LogitLens",
    "attribute_generation",
    "explain_generation",
    "find_head_roles",
    "head_role_scores",
    "logit_lens",
    "write_generation_explanations",
    "Comparison",
    "Explanation",
    "compare_models",
    "explain",
    "write_comparison",
    "write_explanation",
    "METHODS",
    "PatchResult",
    "TokenAttributions",
    "attention_flow",
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
