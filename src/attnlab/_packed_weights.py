"""Weight matrices repacked for products with a few rows, as decoding steps compute them.

A decoding step multiplies every weight matrix by one row per sequence. For a handful of
rows (4 to 32) torch's float32 product ``x @ W^T`` with a row-major ``W`` runs well below
the memory bandwidth that bounds it: on a 2-core AVX-512 machine, one pass of 8 rows over
the 382 MiB of a 12-layer, width-768 Llama takes 45-50 ms where one row takes 18 ms. MKL's
packed GEMM (the ``mkl._mkl_linear`` operator torch's compiler uses for frozen weights),
given the weights reordered once for that row count, takes 27-30 ms for the same pass,
with the same numbers up to float32 rounding order. At 1 and 2 rows it gains nothing.

The repacked copies take 2 to 3 times the weights' bytes (2.8 for the shapes above), so they exist only inside
:func:`packed_for_rows` (``generate`` opens it for its decoding steps) and only up to a
byte budget; layers past the budget keep the plain product.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch import Tensor, nn

__all__ = ["PACKED_BYTES_BUDGET", "mkl_packing_available", "packed_for_rows", "packed_linear"]

PACKED_BYTES_BUDGET = 2 * 2**30
"""Most bytes :func:`packed_for_rows` spends on repacked copies (2 GiB)."""


@functools.cache
def mkl_packing_available() -> bool:
    """Whether this torch build has MKL's packed float32 GEMM operators."""
    try:
        weight = torch.ones(4, 4)
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, 2)
        torch.ops.mkl._mkl_linear(torch.ones(2, 4), packed, weight, None, 2)
    except (AttributeError, RuntimeError):
        return False
    return True


def packed_linear(module: nn.Module, x: Tensor) -> Tensor | None:
    """``module``'s product with ``x`` through its repacked weight, or ``None`` when it has
    none for ``x``'s row count (or gradients, autocast or dtypes rule it out)."""
    packed = module.__dict__.get("_packed_weight")
    if packed is None:
        return None
    rows, weight = packed
    if (x.numel() != rows * x.shape[-1] or x.dtype != torch.float32 or torch.is_autocast_enabled("cpu")
            or (torch.is_grad_enabled() and (x.requires_grad or module.weight.requires_grad))):
        return None
    return torch.ops.mkl._mkl_linear(x, weight, module.weight, module.bias, rows)


@contextlib.contextmanager
def packed_for_rows(model: nn.Module, rows: int, *, budget: int = PACKED_BYTES_BUDGET) -> Iterator[int]:
    """Inside the block, ``model``'s attnlab ``Linear`` layers (``takes_packed_weights``)
    multiply ``rows``-row inputs by weights MKL reordered for that row count; other inputs
    take the plain product.

    Only float32 CPU weights are repacked, largest first, while the copies stay within
    ``budget`` bytes; on a build without MKL nothing is. The copies are dropped on exit.
    Weights must not change inside the block (the copies would not follow).

    Yields:
        How many layers were repacked.
    """
    layers = [module for module in model.modules()
              if getattr(module, "takes_packed_weights", False) and module.weight.dtype == torch.float32
              and module.weight.device.type == "cpu"]
    packed: list[nn.Module] = []
    try:
        if mkl_packing_available():
            spent, sizes = 0, {}  # packed bytes by weight shape, so that no copy is made only to be dropped
            for module in sorted(layers, key=lambda layer: -layer.weight.numel()):
                shape = tuple(module.weight.shape)
                if shape in sizes and spent + sizes[shape] > budget:
                    continue
                with torch.no_grad():
                    weight = torch.ops.mkl._mkl_reorder_linear_weight(module.weight, rows)
                size = sizes[shape] = weight.numel() * weight.element_size()
                if spent + size > budget:
                    continue
                spent += size
                module.__dict__["_packed_weight"] = (rows, weight)
                packed.append(module)
        yield len(packed)
    finally:
        for module in packed:
            module.__dict__.pop("_packed_weight", None)
