"""Sparse attention: block-local windows plus global tokens, any length, O(T·block).

``SparseAttention`` (the article's module, corrected) runs on ``block_sparse_attention``,
whose fast path is the block-window kernel (``_block_window_kernel``; C++ compiled on first
use: ``_block_window_amx`` on AMX CPUs, ``_block_window_portable`` elsewhere, torch's ops in
``_block_window_torch`` beside them, chosen by :mod:`attnlab._dispatch`); ``pattern`` draws
which keys each query sees.
"""

from .block_sparse import BlockSparseResult, BlockSparseWeights, block_sparse_attention, block_sparse_mask
from .pattern import block_pattern_density, draw_sparsity_pattern
from .sparse_attention import SparseAttention

__all__ = [
    "BlockSparseResult",
    "BlockSparseWeights",
    "SparseAttention",
    "block_pattern_density",
    "block_sparse_attention",
    "block_sparse_mask",
    "draw_sparsity_pattern",
]
