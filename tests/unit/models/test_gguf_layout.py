"""GGUF reading, tested without a file: llama.cpp's rotary row permutation is undone."""

from __future__ import annotations

import torch

from attnlab.checkpoints.gguf.weights import unpermute_rotary_rows


def _llama_cpp_permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's convert_hf_to_gguf permutation of a query or key projection."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def test_unpermute_inverts_llama_cpp_permutation():
    weight = torch.randn(3 * 8, 5)
    assert torch.equal(unpermute_rotary_rows(_llama_cpp_permute(weight, 3), 3), weight)
    assert not torch.equal(_llama_cpp_permute(weight, 3), weight)
