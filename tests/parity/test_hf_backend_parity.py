"""attnlab as transformers' attention backend, against transformers itself, architecture by architecture.

Each case is a tiny random model that transformers builds at test time from its own
config class. On a padded batch (left padding for decoders, right for encoders, none
for images) four things are checked:

1. ``attach(model)`` with no layer chosen gives what ``attn_implementation="sdpa"``
   gives (the fused path is transformers' own sdpa function);
2. the chosen layers' weights, attnlab's and transformers' ``out.attentions`` under
   ``attach``, equal transformers' ``eager`` weights on every row that has a key to
   attend (attnlab gives zeros on the others, eager spreads them uniformly);
3. ``head_mask`` equals zeroing that head's columns at the input of the output
   projection (a forward pre-hook on the sdpa model);
4. after the block every config has its implementation back.

Models that soft-cap scores or add sinks have no sdpa in transformers: eager is their
reference for 1 and 3. Models whose attention does not go through
``AttentionInterface`` must be refused, never served wrongly.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Optional

import pytest
import torch
from torch import Tensor, nn

transformers = pytest.importorskip(
    "transformers", reason="parity with HuggingFace needs transformers (pip install -e '.[dev]')"
)

from attnlab.hf import attach, attention_sites  # noqa: E402  (after the importorskip)

OUTPUT_TOLERANCE = 1e-6
WEIGHT_TOLERANCE = 1e-5
VOCAB = 99
B, T, PAD = 2, 8, 3  # the second sequence has PAD padding tokens
DECODER_T = 6  # decoder length of encoder-decoder models
IMAGE = 32


@dataclasses.dataclass(frozen=True)
class Case:
    """One architecture: how to build it and what to feed it.

    ``kind``: ``decoder`` (left padding, causal), ``encoder`` (right padding), ``seq2seq``
    (right-padded source and target), ``vision`` (pixels, no mask), ``speech`` (Whisper),
    ``dual`` (a text tower with right padding and a vision tower).
    """

    config: str
    model: str
    kwargs: dict
    kind: str
    layers: tuple = (2,)  # attach(layers=...) of the weights check
    reference: str = "sdpa"  # what check 1 and 3 compare with ("eager" where sdpa refuses)
    kinds: str = ""  # attention kinds the case exercises (for the table in the docs)


def _decoder(**extra) -> dict:
    return {
        "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "initializer_range": 0.2, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, **extra,
    }


def _bert(**extra) -> dict:
    return {
        "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 64, "initializer_range": 0.2, "pad_token_id": 0,
        **extra,
    }


def _bart(**extra) -> dict:
    return {
        "vocab_size": VOCAB, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64, "max_position_embeddings": 64, "init_std": 0.2, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1, **extra,
    }


def _vit(**extra) -> dict:
    return {
        "image_size": IMAGE, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 64, "initializer_range": 0.2, **extra,
    }


def _towers(**text_extra) -> dict:
    text = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 16, **text_extra}
    vision = {"image_size": IMAGE, "patch_size": 8, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4}
    return {"text_config": text, "vision_config": vision}


CASES: dict[str, Case] = {
    "llama": Case("LlamaConfig", "LlamaModel", _decoder(), "decoder", kinds="causal, GQA"),
    "mistral": Case("MistralConfig", "MistralModel", _decoder(sliding_window=3), "decoder",
                    kinds="causal, sliding, GQA"),
    "mixtral": Case("MixtralConfig", "MixtralModel", _decoder(num_local_experts=4, num_experts_per_tok=2),
                    "decoder", kinds="causal, GQA"),
    "qwen2": Case("Qwen2Config", "Qwen2Model", _decoder(), "decoder", kinds="causal, GQA"),
    "qwen3": Case("Qwen3Config", "Qwen3Model", _decoder(head_dim=8), "decoder", kinds="causal, GQA, q/k norm"),
    "gemma": Case("GemmaConfig", "GemmaModel", _decoder(head_dim=8), "decoder", kinds="causal, GQA"),
    # sdpa refuses soft-capped scores (transformers sets _supports_sdpa = False): eager is the reference
    "gemma2": Case("Gemma2Config", "Gemma2Model",
                   _decoder(head_dim=8, sliding_window=3, attn_logit_softcapping=2.0, query_pre_attn_scalar=8),
                   "decoder", layers=(1, 2), reference="eager", kinds="causal, sliding (layer 1), softcap"),
    "gemma3": Case("Gemma3TextConfig", "Gemma3TextModel",
                   _decoder(head_dim=8, sliding_window=3, query_pre_attn_scalar=8,
                            layer_types=["sliding_attention", "full_attention"]),
                   "decoder", layers=(1, 2), kinds="causal, sliding (layer 1), GQA, q/k norm"),
    "phi": Case("PhiConfig", "PhiModel", _decoder(num_key_value_heads=4, partial_rotary_factor=0.5), "decoder",
                kinds="causal, partial rotary"),
    "phi3": Case("Phi3Config", "Phi3Model", _decoder(), "decoder", kinds="causal, GQA, fused qkv"),
    "olmo2": Case("Olmo2Config", "Olmo2Model", _decoder(), "decoder", kinds="causal, GQA, q/k norm"),
    "stablelm": Case("StableLmConfig", "StableLmModel", _decoder(), "decoder", kinds="causal, GQA"),
    "cohere": Case("CohereConfig", "CohereModel", _decoder(), "decoder", kinds="causal, GQA"),
    # attention sinks: no sdpa in transformers (_supports_sdpa = False), eager is the reference
    "gpt_oss": Case("GptOssConfig", "GptOssModel",
                    _decoder(head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=3,
                             layer_types=["sliding_attention", "full_attention"]),
                    "decoder", layers=(1, 2), reference="eager", kinds="causal, sliding (layer 1), sinks, GQA"),
    "granite": Case("GraniteConfig", "GraniteModel", _decoder(attention_multiplier=0.3), "decoder",
                    kinds="causal, GQA, custom scaling"),
    "starcoder2": Case("Starcoder2Config", "Starcoder2Model", _decoder(sliding_window=3), "decoder",
                       kinds="causal, sliding, GQA"),
    "opt": Case("OPTConfig", "OPTModel",
                {"vocab_size": VOCAB, "hidden_size": 32, "ffn_dim": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "max_position_embeddings": 64, "word_embed_proj_dim": 32,
                 "init_std": 0.2, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
                "decoder", kinds="causal"),
    "gpt2": Case("GPT2Config", "GPT2Model",
                 {"vocab_size": VOCAB, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64,
                  "initializer_range": 0.2}, "decoder", kinds="causal"),
    "gpt_neox": Case("GPTNeoXConfig", "GPTNeoXModel",
                     _decoder(num_key_value_heads=None, rotary_pct=0.5), "decoder", kinds="causal, partial rotary"),
    "bert": Case("BertConfig", "BertModel", _bert(), "encoder", kinds="self"),
    "roberta": Case("RobertaConfig", "RobertaModel", _bert(pad_token_id=1, type_vocab_size=1), "encoder",
                    kinds="self"),
    "xlm_roberta": Case("XLMRobertaConfig", "XLMRobertaModel", _bert(pad_token_id=1, type_vocab_size=1),
                        "encoder", kinds="self"),
    "electra": Case("ElectraConfig", "ElectraModel", _bert(embedding_size=16), "encoder", kinds="self"),
    "distilbert": Case("DistilBertConfig", "DistilBertModel",
                       {"vocab_size": VOCAB, "dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64,
                        "max_position_embeddings": 64, "initializer_range": 0.2, "pad_token_id": 0},
                       "encoder", kinds="self"),
    "modernbert": Case("ModernBertConfig", "ModernBertModel",
                       _bert(global_attn_every_n_layers=2, local_attention=4, initializer_range=0.2),
                       "encoder", layers=(1, 2), kinds="self, sliding bidirectional (layer 2)"),
    "t5": Case("T5Config", "T5Model",
               {"vocab_size": VOCAB, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
                "relative_attention_num_buckets": 8, "initializer_factor": 1.0, "pad_token_id": 0,
                "decoder_start_token_id": 0}, "seq2seq", kinds="self, causal, cross, position bias"),
    "bart": Case("BartConfig", "BartModel", _bart(), "seq2seq", kinds="self, causal, cross"),
    "marian": Case("MarianConfig", "MarianModel", _bart(), "seq2seq", kinds="self, causal, cross"),
    "mbart": Case("MBartConfig", "MBartModel", _bart(), "seq2seq", kinds="self, causal, cross"),
    "whisper": Case("WhisperConfig", "WhisperModel",
                    _bart(num_mel_bins=8, max_source_positions=4, max_target_positions=16),
                    "speech", kinds="self (audio), causal, cross"),
    "vit": Case("ViTConfig", "ViTModel", _vit(), "vision", kinds="self (vision)"),
    "deit": Case("DeiTConfig", "DeiTModel", _vit(), "vision", kinds="self (vision)"),
    "beit": Case("BeitConfig", "BeitModel", _vit(use_relative_position_bias=True), "vision",
                 kinds="self (vision), relative position bias"),
    "dinov2": Case("Dinov2Config", "Dinov2Model", _vit(), "vision", kinds="self (vision)"),
    "clip": Case("CLIPConfig", "CLIPModel", {**_towers(), "projection_dim": 16}, "dual",
                 kinds="causal (text), self (vision)"),
    # SiglipModel itself is refused (its vision tower's pooling head is a torch
    # nn.MultiheadAttention, see REFUSED): its towers alone, the vision one without that head
    "siglip_text": Case("SiglipTextConfig", "SiglipTextModel", _towers()["text_config"], "encoder",
                        kinds="self (text)"),
    "siglip_vision": Case("SiglipVisionConfig", "SiglipVisionModel",
                          {**_towers()["vision_config"], "vision_use_head": False}, "vision", kinds="self (vision)"),
}

# Attention outside AttentionInterface: attach must refuse these.
REFUSED = {
    # the vision tower's attention-pooling head is a torch nn.MultiheadAttention
    "siglip": ("SiglipConfig", "SiglipModel", _towers()),
}

# Architectures whose attention a transformers release moved onto AttentionInterface (Falcon
# in 5.25) or may move: served at parity where the installed transformers routes them,
# refused where it does not. Which one is read from transformers' own source, not attnlab's.
MOVING = {
    "falcon": Case("FalconConfig", "FalconModel",
                   {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "initializer_range": 0.2, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
                   "decoder", kinds="causal, multi-query"),
    "bloom": Case("BloomConfig", "BloomModel",
                  {"vocab_size": VOCAB, "hidden_size": 32, "n_layer": 2, "n_head": 4, "initializer_range": 0.2,
                   "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}, "decoder", kinds="causal, ALiBi"),
}


def _routed_by_installed_transformers(case: Case) -> bool:
    source = inspect.getsource(inspect.getmodule(getattr(transformers, case.model)))
    return "ALL_ATTENTION_FUNCTIONS" in source


for _name, _case in MOVING.items():
    if _routed_by_installed_transformers(_case):
        CASES[_name] = _case
    else:
        REFUSED[_name] = (_case.config, _case.model, _case.kwargs)


# -- building models and inputs ------------------------------------------------------------

_BUILT: dict[str, nn.Module] = {}


def _model(name: str) -> nn.Module:
    """The case's model (built once; every test sets the implementation it needs)."""
    if name not in _BUILT:
        case = CASES[name]
        torch.manual_seed(0)
        config = getattr(transformers, case.config)(**case.kwargs)
        _BUILT[name] = getattr(transformers, case.model)(config).eval()
    return _BUILT[name]


def _inputs(case: Case) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (B, T), generator=generator)
    right = torch.ones(B, T, dtype=torch.long)
    right[1, T - PAD:] = 0
    if case.kind == "decoder":
        left = torch.ones(B, T, dtype=torch.long)
        left[1, :PAD] = 0
        return {"input_ids": ids, "attention_mask": left, "use_cache": False}
    if case.kind == "encoder":
        return {"input_ids": ids, "attention_mask": right}
    pixels = torch.randn(B, 3, IMAGE, IMAGE, generator=generator)
    if case.kind == "vision":
        return {"pixel_values": pixels}
    if case.kind == "dual":
        return {"input_ids": ids, "attention_mask": right, "pixel_values": pixels}
    target = torch.randint(3, VOCAB, (B, DECODER_T), generator=generator)
    target_mask = torch.ones(B, DECODER_T, dtype=torch.long)
    target_mask[1, DECODER_T - 2:] = 0
    decoder = {"decoder_input_ids": target, "decoder_attention_mask": target_mask, "use_cache": False}
    if case.kind == "speech":
        config = _model_config(case)
        features = torch.randn(B, config.num_mel_bins, 2 * config.max_source_positions, generator=generator)
        return {"input_features": features, **decoder}
    return {"input_ids": ids, "attention_mask": right, **decoder}


def _model_config(case: Case):
    return getattr(transformers, case.config)(**case.kwargs)


def _tensors(output: Any) -> list[Tensor]:
    """Every floating tensor of a model output, in order (nested outputs and tuples flattened)."""
    if isinstance(output, Tensor):
        return [output] if output.is_floating_point() else []
    if isinstance(output, transformers.utils.ModelOutput):
        output = output.to_tuple()
    if isinstance(output, (tuple, list)):
        return [tensor for item in output for tensor in _tensors(item)]
    return []  # caches and other bookkeeping


def _run(model: nn.Module, inputs: dict, **extra) -> Any:
    with torch.no_grad():
        return model(**inputs, **extra)


_EAGER: dict[str, Any] = {}


def _eager(name: str) -> Any:
    """The case's eager outputs with weights (computed once: the weights never change)."""
    if name not in _EAGER:
        model = _model(name)
        model.set_attn_implementation("eager")
        _EAGER[name] = _run(model, _inputs(CASES[name]), output_attentions=True)
    return _EAGER[name]


def _real_rows(case: Case, inputs: dict) -> Optional[Tensor]:
    """``[B, T, 1]`` True on real positions of a decoder's left-padded batch (pad rows of a
    causal decoder have no key, where attnlab and eager differ by design), else ``None``."""
    if case.kind != "decoder":
        return None
    return inputs["attention_mask"].bool()[:, :, None]


def _max_difference(case: Case, inputs: dict, got: Any, want: Any) -> float:
    got_tensors, want_tensors = _tensors(got), _tensors(want)
    assert len(got_tensors) == len(want_tensors) > 0
    rows = _real_rows(case, inputs) if case.reference == "eager" else None
    worst = 0.0
    for a, b in zip(got_tensors, want_tensors):
        assert a.shape == b.shape
        if rows is not None and a.dim() == 3 and a.shape[:2] == rows.shape[:2]:
            a, b = a * rows, b * rows  # per-position states: pad rows differ by design
        worst = max(worst, (a - b).abs().max().item())
    return worst


def _configs(model: nn.Module) -> list[Any]:
    """The model's config and every sub-config and module config (what reads the implementation)."""
    found: dict[int, Any] = {}
    pending = [model.config] + [getattr(module, "config", None) for module in model.modules()]
    while pending:
        config = pending.pop()
        if not isinstance(config, transformers.PretrainedConfig) or id(config) in found:
            continue
        found[id(config)] = config
        pending.extend(getattr(config, key, None) for key in config.sub_configs)
    return list(found.values())


# -- which eager tensor holds which layer --------------------------------------------------

def _stack_and_index(name: str) -> tuple[str, int]:
    """``cross.layer_2`` -> ``("cross", 1)``; ``layer_3`` -> ``("", 2)``."""
    stack, _, number = name.rpartition("layer_")
    return stack.rstrip("."), int(number) - 1


def _returned_attentions(case: Case, output: Any, stack: str) -> tuple:
    """transformers' tuple of weights of one attnlab stack (``""``, ``encoder``, ``cross``, ``vision``, ...)."""
    if case.kind in ("seq2seq", "speech"):
        field = {"encoder": "encoder_attentions", "decoder": "decoder_attentions", "cross": "cross_attentions"}[stack]
        return getattr(output, field)
    if case.kind == "dual":
        return getattr(output, f"{stack}_model_output").attentions
    assert stack == ""
    return output.attentions


def _eager_weights(case: Case, output: Any, name: str) -> Tensor:
    """transformers' weights of the attnlab layer ``name`` (``layer_2``, ``cross.layer_1``, ...)."""
    stack, index = _stack_and_index(name)
    return _returned_attentions(case, output, stack)[index]


def _rows_without_keys(case: Case, layer: str, inputs: dict, shape: torch.Size) -> Tensor:
    """``[B, H, T]`` True on the query rows that have no key to attend, from the inputs alone.

    A left-padded decoder's pad rows (causal: only pad keys before them); ModernBERT's
    local layers (``layer_2`` here, window of ``local_attention`` keys around the query):
    the rows whose window holds only padding. No other case has such rows.
    """
    B, H, T, S = shape
    if case.kind == "decoder":
        return ~inputs["attention_mask"].bool()[:, None, :].expand(B, H, T)
    if case.config == "ModernBertConfig" and layer == "layer_2":
        half = case.kwargs["local_attention"] // 2
        positions = torch.arange(T)
        window = (positions[:, None] - positions[None, :]).abs() <= half  # [T, S]
        allowed = window[None] & inputs["attention_mask"].bool()[:, None, :]  # [B, T, S]
        return ~allowed.any(-1)[:, None, :].expand(B, H, T)
    return torch.zeros(B, H, T, dtype=torch.bool)


def _compare_weights(got: Tensor, want: Tensor, empty: Tensor, sinks: bool) -> float:
    """Max difference on the rows that have a key (``empty``: ``[B, H, T]``, those without):
    attnlab gives zeros on the others, eager spreads them uniformly over the masked keys."""
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.all(got[empty] == 0)
    if not sinks:  # with sinks, eager's rows without keys are all sink (zeros) too
        assert torch.allclose(want[empty], torch.full((), 1.0 / want.shape[-1]))
    sums = got.sum(-1)[~empty]
    if sinks:  # the sink takes its share of each row
        assert torch.all(sums < 1.0) and torch.all(sums > 0.0)
    else:
        assert torch.allclose(sums, torch.ones(()), atol=WEIGHT_TOLERANCE)
    return (got - want).abs()[~empty].max().item()


def _check_layer(case: Case, layer: str, inputs: dict, got: Tensor, want: Any) -> tuple[float, int]:
    """attnlab's weights of ``layer`` against eager's: (max difference, rows without keys)."""
    reference = _eager_weights(case, want, layer)
    empty = _rows_without_keys(case, layer, inputs, reference.shape)
    return _compare_weights(got, reference, empty, "sinks" in case.kinds), int(empty.sum())


# -- output projection of an attention module ----------------------------------------------

_PROJECTIONS = ("o_proj", "out_proj", "o", "c_proj", "dense", "out_lin", "Wo")


def _output_projection(model: nn.Module, path: str) -> nn.Module:
    """The module whose input is the attention's ``[B, T, H * D]`` output (head h at columns
    ``h * D .. (h + 1) * D``): a child of the attention module, or ``output.dense`` of its
    parent (BERT-style ``SelfAttention`` / ``SelfOutput`` pairs)."""
    module = model.get_submodule(path)
    for name in _PROJECTIONS:
        if isinstance(getattr(module, name, None), nn.Module):
            return getattr(module, name)
    parent = model.get_submodule(path.rpartition(".")[0])
    return parent.output.dense


def _zero_head_columns(head: int, heads: int) -> Callable:
    def hook(module: nn.Module, args: tuple) -> tuple:
        (states, *rest) = args
        D = states.shape[-1] // heads
        states = states.clone()
        states[..., head * D:(head + 1) * D] = 0.0
        return (states, *rest)

    return hook


# -- the checks --------------------------------------------------------------------------------

MEASURED: dict[str, dict[str, Any]] = {}  # figures for the architecture table in the docs


@pytest.mark.parametrize("name", sorted(CASES))
def test_attach_without_layers_equals_sdpa(name: str) -> None:
    case, model = CASES[name], _model(name)
    inputs = _inputs(case)
    model.set_attn_implementation(case.reference)
    want = _run(model, inputs)
    with attach(model) as seen:
        got = _run(model, inputs)
    assert len(seen.attentions) == 0 and len(seen.cross_attentions) == 0  # nothing asked, nothing kept
    difference = _max_difference(case, inputs, got, want)
    MEASURED.setdefault(name, {})["outputs"] = difference
    assert difference <= OUTPUT_TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_chosen_layer_weights_equal_eager(name: str) -> None:
    case, model = CASES[name], _model(name)
    inputs = _inputs(case)
    want = _eager(name)
    with attach(model, layers=list(case.layers)) as seen:
        got = _run(model, inputs, output_attentions=True)
    sites = {site.name: site for site in attention_sites(model)}
    chosen = [n for n in sites if int(n.rpartition("layer_")[2]) in case.layers]
    recorded = {**dict(seen.attentions.items()), **dict(seen.cross_attentions.items())}
    assert sorted(recorded) == sorted(chosen)
    worst, empty_rows = 0.0, 0
    for layer in chosen:
        difference, empty = _check_layer(case, layer, inputs, recorded[layer], want)
        worst, empty_rows = max(worst, difference), empty_rows + empty
    MEASURED.setdefault(name, {}).update(weights=worst, rows_without_keys=empty_rows)
    assert worst <= WEIGHT_TOLERANCE


# GPT-2 and StableLM take output_attentions as a forward argument and keep it; OPT's and
# SigLIP's layers do not pass it down: attnlab reads it at the model's own call instead.
@pytest.mark.parametrize("name", sorted(CASES))
def test_output_attentions_under_attach_equals_eager(name: str) -> None:
    """``output_attentions=True`` under ``attach``. With chosen layers, transformers' own
    ``out.attentions``: the layers left on the fused path return None, which transformers'
    output recorder drops, so each stack's tuple holds exactly its chosen layers, in order.
    A model that collects them in its own loop (Falcon) keeps None in the other layers' places.
    With none chosen, every layer is exact (as eager)."""
    case, model = CASES[name], _model(name)
    inputs = _inputs(case)
    want = _eager(name)
    with attach(model, layers=list(case.layers)) as seen:
        got = _run(model, inputs, output_attentions=True)
    recorded = {**dict(seen.attentions.items()), **dict(seen.cross_attentions.items())}
    for stack in {_stack_and_index(layer)[0] for layer in recorded}:
        members = sorted((layer for layer in recorded if _stack_and_index(layer)[0] == stack), key=_stack_and_index)
        returned = _returned_attentions(case, got, stack)
        if any(weights is None for weights in returned):  # Falcon collects them in its own loop: None in place
            assert [i for i, weights in enumerate(returned) if weights is not None] == [
                _stack_and_index(layer)[1] for layer in members]
            returned = tuple(weights for weights in returned if weights is not None)
        assert len(returned) == len(members) > 0
        for layer, weights in zip(members, returned):
            assert torch.equal(weights, recorded[layer])
            _check_layer(case, layer, inputs, weights, want)
    # no layer chosen: output_attentions=True makes every layer exact, as eager
    with attach(model) as seen:
        _run(model, inputs, output_attentions=True)
    recorded = {**dict(seen.attentions.items()), **dict(seen.cross_attentions.items())}
    assert sorted(recorded) == sorted(site.name for site in attention_sites(model))
    for layer, weights in recorded.items():
        difference, _ = _check_layer(case, layer, inputs, weights, want)
        assert difference <= WEIGHT_TOLERANCE



@pytest.mark.parametrize("name", sorted(CASES))
def test_head_mask_equals_zeroed_projection_input(name: str) -> None:
    case, model = CASES[name], _model(name)
    inputs = _inputs(case)
    model.set_attn_implementation(case.reference)
    masked = {site.name: site for site in attention_sites(model) if site.name.endswith("layer_2")}
    head = 1
    handles = [
        _output_projection(model, site.path).register_forward_pre_hook(_zero_head_columns(head, site.heads))
        for site in masked.values()
    ]
    try:
        want = _run(model, inputs)
    finally:
        for handle in handles:
            handle.remove()
    unmasked = _run(model, inputs)
    with attach(model, head_mask={layer: [head] for layer in masked}):
        got = _run(model, inputs)
    difference = _max_difference(case, inputs, got, want)
    MEASURED.setdefault(name, {})["head_mask"] = (difference, sorted(masked))
    assert _max_difference(case, inputs, unmasked, want) > 1e-4  # the head matters
    assert difference <= OUTPUT_TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_configs_restored_after_the_block(name: str) -> None:
    case, model = CASES[name], _model(name)
    inputs = _inputs(case)
    model.set_attn_implementation(case.reference)
    before = [(config, config._attn_implementation) for config in _configs(model)]
    want = _run(model, inputs)
    with attach(model, layers=list(case.layers)):
        assert all(config._attn_implementation == "attnlab" for config, _ in before)
        _run(model, inputs, output_attentions=True)
    assert [(config, config._attn_implementation) for config in _configs(model)] == before
    assert all(implementation == case.reference for _, implementation in before)
    got = _run(model, inputs)
    assert _max_difference(case, inputs, got, want) == 0.0


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_attention_outside_the_interface_is_refused(name: str) -> None:
    config_class, model_class, kwargs = REFUSED[name]
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs)).eval()
    implementation = model.config._attn_implementation
    with pytest.raises(ValueError, match="without transformers' AttentionInterface"):
        with attach(model):
            pass
    assert model.config._attn_implementation == implementation


def test_attention_module_shared_by_layers_is_refused() -> None:
    """ALBERT runs one attention module for every layer. attnlab names modules, so it sees one
    layer (``layer_1``), whose recorded weights are those of the last call (the last layer,
    not the first) and whose head mask hits every layer, were it served: it is refused at
    the second call of the module in one forward, naming attnlab's own ALBERT."""
    config = transformers.AlbertConfig(**_bert(embedding_size=16))
    model = transformers.AlbertModel(config).eval()
    case = Case("AlbertConfig", "AlbertModel", {}, "encoder")
    inputs = _inputs(case)
    model.set_attn_implementation("eager")
    with pytest.raises(ValueError, match=r"AlbertAttention at .* runs more than once in one forward .*"
                                         r"attnlab.load opens ALBERT"):
        with attach(model, layers=[1]):
            _run(model, inputs)
    assert model.config._attn_implementation == "eager"  # refused, and left as it was
