"""Read a Llama-family GGUF file (llama.cpp's format) into a :class:`DecoderConfig` and weights.

Every tensor is dequantised to float32 with the ``gguf`` package (4-bit and 8-bit blocks
become the float values they stand for; the quantisation error stays in the weights).
GGUF stores the query and key projections with the rows of each head interleaved for
llama.cpp's rotary layout; :func:`unpermute_rotary_rows` puts them back in the "rotate
half" order that HuggingFace and attnlab use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch
from torch import Tensor

from ...layers.decoder_config import DecoderConfig
from ..errors import UnsupportedCheckpointError

__all__ = ["gguf_metadata", "open_gguf", "read_gguf", "unpermute_rotary_rows"]

_LAYER_NAMES = {
    "attn_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "feed_forward.gate_proj.weight",
    "ffn_up.weight": "feed_forward.up_proj.weight",
    "ffn_down.weight": "feed_forward.down_proj.weight",
}


def _reader(path: Union[str, Path]):
    try:
        from gguf import GGUFReader
    except ImportError as error:
        if getattr(error, "name", None) not in (None, "gguf"):  # gguf is there, but what it imports is not
            raise ImportError(f"the installed gguf package cannot be imported ({error}); attnlab reads GGUF files "
                              f"with gguf 0.17.1 or newer: pip install 'attnlab[gguf]'") from None
        raise ImportError("reading GGUF files needs the gguf package: pip install 'attnlab[gguf]'") from None
    return GGUFReader(str(path))


def open_gguf(source: Any):
    """A ``GGUFReader`` of ``source``: a path is opened (parsing a GGUF file's metadata and
    tensor table takes seconds: open it once and pass the reader on), a reader is returned
    as it is."""
    return _reader(source) if isinstance(source, (str, Path)) else source


def gguf_metadata(reader: Any) -> dict[str, Any]:
    """Every metadata field of a ``GGUFReader`` except the tokenizer's long lists."""
    skip = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
    return {name: field.contents() for name, field in reader.fields.items()
            if name not in skip and not name.startswith("GGUF.")}


def unpermute_rotary_rows(weight: Tensor, heads: int) -> Tensor:
    """Undo llama.cpp's permutation of a ``[heads * D, E]`` query or key projection.

    llama.cpp's converter reshapes each head's ``D`` rows as ``[2, D/2]`` and transposes
    them to ``[D/2, 2]`` (pairs ``(i, i + D/2)`` become neighbours); this is the inverse.
    """
    rows = weight.shape[0]
    half = rows // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def _config(meta: dict[str, Any], source: str) -> DecoderConfig:
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise UnsupportedCheckpointError(f"{source}: GGUF architecture {arch!r} is not supported (only 'llama')")

    def value(key: str, default: Any = None) -> Any:
        found = meta.get(f"llama.{key}", default)
        if found is None:
            raise UnsupportedCheckpointError(f"{source}: GGUF metadata lacks llama.{key}")
        return found

    heads = int(value("attention.head_count"))
    scaling = None
    if meta.get("llama.rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear", "factor": float(meta["llama.rope.scaling.factor"])}
    elif meta.get("llama.rope.scaling.type") not in (None, "none"):
        raise UnsupportedCheckpointError(f"{source}: rope scaling {meta['llama.rope.scaling.type']!r} is not supported")
    d_model = int(value("embedding_length"))
    head_dim = int(meta.get("llama.attention.key_length", d_model // heads))
    vocab = meta.get("llama.vocab_size")
    return DecoderConfig(
        vocab_size=int(vocab) if vocab is not None else len(meta["_tokens"]),
        d_model=d_model,
        num_layers=int(value("block_count")),
        num_heads=heads,
        d_ff=int(value("feed_forward_length")),
        num_kv_heads=int(meta.get("llama.attention.head_count_kv", heads)),
        head_dim=None if head_dim == d_model // heads else head_dim,
        max_len=int(value("context_length", 2048)),
        norm="rms",
        norm_eps=float(value("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(value("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        tie_embeddings=True,  # changed below when the file has output.weight
        pad_id=meta.get("tokenizer.ggml.padding_token_id"),
        bos_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_id=meta.get("tokenizer.ggml.eos_token_id"),
    )


def read_gguf(source: Any, *, dtype: Optional[torch.dtype] = None) -> tuple[DecoderConfig, dict[str, Tensor]]:
    """``(config, state dict)`` of a Llama-family GGUF file, weights dequantised to float32.

    Args:
        source: the file's path, or a ``GGUFReader`` of it (see :func:`open_gguf`).
        dtype: each tensor is converted to it as soon as it is dequantised (default: float32).

    Raises:
        ImportError: the ``gguf`` package is missing.
        UnsupportedCheckpointError: another architecture, or tensors that do not fit.
    """
    from gguf import dequantize

    reader = open_gguf(source)
    path = getattr(reader, "data", None)
    path = getattr(path, "filename", None) or str(source)
    meta = gguf_metadata(reader)
    if "llama.vocab_size" not in meta and "tokenizer.ggml.tokens" in reader.fields:
        meta["llama.vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    config = _config(meta, str(path))
    H, K = config.num_heads, config.kv_heads
    raw: dict[str, Tensor] = {}
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type)  # numpy, in HuggingFace's [out, in] order
        # a copy: F32 tensors are read-only maps
        weights = torch.from_numpy(np.array(values, dtype=np.float32))
        raw[tensor.name] = weights if dtype is None else weights.to(dtype)
    state: dict[str, Tensor] = {"embed_tokens.weight": raw.pop("token_embd.weight"),
                                "norm.weight": raw.pop("output_norm.weight")}
    if "output.weight" in raw:
        config.tie_embeddings = False
        state["lm_head.weight"] = raw.pop("output.weight")
    for i in range(config.num_layers):
        prefix = f"blk.{i}."
        for name, ours in _LAYER_NAMES.items():
            state[f"layers.{i}.{ours}"] = raw.pop(prefix + name)
        q = unpermute_rotary_rows(raw.pop(prefix + "attn_q.weight"), H)
        k = unpermute_rotary_rows(raw.pop(prefix + "attn_k.weight"), K)
        v = raw.pop(prefix + "attn_v.weight")
        state[f"layers.{i}.self_attn.qkv_proj.weight"] = torch.cat((q, k, v))  # [(H + 2K) * D, E]
    leftover = sorted(name for name in raw if not name.startswith("rope_"))
    if leftover:
        raise UnsupportedCheckpointError(f"{path}: unexpected GGUF tensors {leftover[:10]}")
    return config, state
