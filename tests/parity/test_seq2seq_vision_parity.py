"""Encoder-decoder pairs and images through attnlab, against transformers' eager weights.

The tiny random models are the backend parity test's (built by transformers at test time).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="parity with HuggingFace needs transformers")

from test_hf_backend_parity import CASES, DECODER_T, IMAGE, VOCAB, _model, _model_config  # noqa: E402

from attnlab.hf.seq2seq import generate_pair, pair_attention  # noqa: E402
from attnlab.hf.vision import image_attention  # noqa: E402
from attnlab.inspect.compute.rollout import attention_rollout  # noqa: E402

TOLERANCE = 1e-5


def _eager(model, **inputs):
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(**inputs, output_attentions=True)
    finally:
        model.set_attn_implementation(previous)


@pytest.mark.parametrize("name", ["t5", "bart", "marian", "whisper"])
def test_pair_attention_equals_eager_self_and_cross_attention(name):
    model = _model(name)
    generator = torch.Generator().manual_seed(3)
    target = torch.randint(3, VOCAB, (DECODER_T,), generator=generator)
    if name == "whisper":
        config = _model_config(CASES[name])
        features = torch.randn(config.num_mel_bins, 2 * config.max_source_positions, generator=generator)
        got = pair_attention(model, None, target, source_features=features)
        want = _eager(model, input_features=features[None], decoder_input_ids=target[None], use_cache=False)
        S = config.max_source_positions
    else:
        source = torch.randint(3, VOCAB, (7,), generator=generator)
        got = pair_attention(model, source, target)
        want = _eager(model, input_ids=source[None], decoder_input_ids=target[None], use_cache=False)
        S = source.numel()
    kinds = (("encoder", want.encoder_attentions, (S, S)), ("decoder", want.decoder_attentions, (DECODER_T,) * 2),
             ("cross", want.cross_attentions, (DECODER_T, S)))
    for kind, eager, shape in kinds:
        maps = getattr(got, kind)
        assert list(maps) == [f"{kind}.layer_{k + 1}" for k in range(len(eager))]
        for (layer, weights), reference in zip(maps.items(), eager):
            assert weights.shape[1:] == shape, (layer, weights.shape)
            torch.testing.assert_close(weights, reference[0], atol=TOLERANCE, rtol=0)


def test_generated_pairs_rows_equal_the_rows_generate_recorded():
    case = CASES["bart"]
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(_model_config(case)).eval()
    source = torch.tensor([5, 9, 14, 22, 2])
    got = generate_pair(model, source, max_new_tokens=4, do_sample=False)
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model.generate(input_ids=source[None], max_new_tokens=4, do_sample=False, output_attentions=True,
                             return_dict_in_generate=True)
    model.set_attn_implementation(previous)
    assert torch.equal(got.target_ids, out.sequences[0])
    for step, layers in enumerate(out.cross_attentions):  # step k: the row of decoder position k
        for index, weights in enumerate(layers):
            torch.testing.assert_close(got.cross[f"cross.layer_{index + 1}"][:, step], weights[0, :, -1],
                                       atol=TOLERANCE, rtol=0)


def _pixels(size):
    return torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("name, prefix", [("vit", 1), ("deit", 2), ("dinov2", 1), ("clip", 1)])
def test_image_attention_equals_eager_and_finds_the_patch_grid(name, prefix):
    model = _model(name)
    pixels = _pixels((IMAGE, IMAGE))
    got = image_attention(model, pixels)
    assert got.grid == (IMAGE // 8, IMAGE // 8) and got.prefix == prefix
    if name == "clip":
        want = _eager(model.vision_model, pixel_values=pixels).attentions
    else:
        want = _eager(model, pixel_values=pixels).attentions
    assert len(got.attentions) == len(want)
    for weights, reference in zip(got.attentions.values(), want):
        torch.testing.assert_close(weights, reference[0], atol=TOLERANCE, rtol=0)
    maps = got.class_token_maps()
    first = next(iter(maps.values()))
    assert first.shape == (4, IMAGE // 8, IMAGE // 8)


@pytest.mark.parametrize("name", ["vit", "dinov2"])
def test_images_of_another_size_get_their_own_grid(name):
    model = _model(name)
    got = image_attention(model, _pixels((48, 24)))  # interpolated position embeddings
    assert got.grid == (6, 3) and got.prefix == 1
    assert next(iter(got.attentions.values())).shape[-1] == 1 + 18


def test_register_tokens_are_counted_before_the_patches():
    torch.manual_seed(0)
    config = transformers.Dinov2WithRegistersConfig(**CASES["dinov2"].kwargs, num_register_tokens=4)
    model = transformers.Dinov2WithRegistersModel(config).eval()
    got = image_attention(model, _pixels((IMAGE, IMAGE)))
    assert got.prefix == 5 and got.grid == (4, 4)


def _vit_explain_rollout(attentions, discard_ratio, head_fusion):
    """vit-explain's rollout (jacobgil/vit-explain), written out; rows renormalised with keepdim
    (its ``a / a.sum(dim=-1)`` scales columns instead)."""
    result = torch.eye(attentions[0].size(-1))
    for attention in attentions:
        if head_fusion == "mean":
            fused = attention.mean(axis=1)
        elif head_fusion == "max":
            fused = attention.max(axis=1)[0]
        else:
            fused = attention.min(axis=1)[0]
        flat = fused.view(fused.size(0), -1)
        _, indices = flat.topk(int(flat.size(-1) * discard_ratio), -1, False)
        indices = indices[indices != 0]
        flat[0, indices] = 0
        eye = torch.eye(fused.size(-1))
        a = (fused + 1.0 * eye) / 2
        a = a / a.sum(dim=-1, keepdim=True)
        result = torch.matmul(a, result)
    mask = result[0, 0, 1:]
    width = int(mask.size(-1) ** 0.5)
    return mask.reshape(width, width).numpy()


@pytest.mark.parametrize("head_fusion, discard_ratio", [("mean", 0.0), ("max", 0.9), ("min", 0.5), ("mean", 0.7)])
def test_vit_rollout_equals_vit_explains(head_fusion, discard_ratio):
    got = image_attention(_model("vit"), _pixels((IMAGE, IMAGE)))
    stacked = [w[None].clone() for w in got.attentions.values()]  # [1, H, N, N]
    want = _vit_explain_rollout([w.clone() for w in stacked], discard_ratio, head_fusion)
    rollout = attention_rollout(stacked, head_fusion=head_fusion, discard_ratio=discard_ratio)[-1, 0]
    mine = rollout[0, got.prefix:].reshape(got.grid).numpy()
    np.testing.assert_allclose(mine, want, atol=1e-6)
