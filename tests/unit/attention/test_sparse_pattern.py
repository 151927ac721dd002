"""Pictures and dense views of the block-sparse pattern."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import block_pattern_density, block_sparse_mask, draw_sparsity_pattern

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_mask_marks_blocks_window_and_global_tokens() -> None:
    mask = block_sparse_mask(10, 4, window=0, global_positions=(9,))
    expected = torch.zeros(10, 10, dtype=torch.bool)
    for start in (0, 4, 8):
        expected[start : start + 4, start : start + 4] = True
    expected[9, :] = True
    expected[:, 9] = True
    assert torch.equal(mask, expected)


@pytest.mark.parametrize("length, block, window, globals_", [(100, 16, 1, (0, 50, 99)), (37, 5, 2, (3,)), (7, 16, 0, ())])
def test_block_density_is_the_exact_average_of_the_mask(length, block, window, globals_) -> None:
    mask = block_sparse_mask(length, block, window, globals_).float()
    density = block_pattern_density(length, block, window, globals_)
    blocks = density.shape[0]
    for row in range(blocks):
        for col in range(blocks):
            cell = mask[row * block : (row + 1) * block, col * block : (col + 1) * block]
            assert density[row, col].item() == pytest.approx(cell.mean().item())


@pytest.mark.parametrize("length", [50, 20000])
def test_draw_writes_a_png(tmp_path, length: int) -> None:
    path = draw_sparsity_pattern(tmp_path / "sub" / "pattern.png", length, 16, 1, (0,), global_summary=True)
    assert path.read_bytes()[:8] == PNG_SIGNATURE
