"""Skipping padding in position-wise work: same numbers on real tokens, zeros at padding."""

from __future__ import annotations

import copy

import pytest
import torch

from attnlab import TransformerEncoder
from attnlab.attention import MultiHeadAttention
from attnlab.attention import packing as packing_module
from attnlab.attention.packing import TokenPacking
from attnlab.inspect import capture_attention

VOCAB, E, LAYERS, HEADS, FF = 60, 32, 2, 4, 64


@pytest.fixture(autouse=True, params=["by-sequence", "padded-layout"])
def attention_route(request, monkeypatch):
    """Every test runs with the fused attention sequence by sequence, and in the padded layout."""
    work = 0 if request.param == "by-sequence" else 10**18
    monkeypatch.setattr(packing_module, "PADDING_WORK_PER_CALL", work)
    return request.param


def _pair(**options) -> tuple[TransformerEncoder, TransformerEncoder]:
    """Two encoders with the same weights: padding skipped, and every position computed."""
    torch.manual_seed(0)
    settings = {"pad_id": 0, "max_len": 16, "dropout": 0.0}
    settings.update(options)
    skipping = TransformerEncoder(VOCAB, d_model=E, num_layers=LAYERS, num_heads=HEADS, d_ff=FF, **settings)
    every = copy.deepcopy(skipping)
    every.config.skip_padding = False
    return skipping, every


def _ids(padding: str = "right") -> torch.Tensor:
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (4, 9))
    ids[0, 6:] = 0
    ids[1, 2:] = 0
    ids[3, 8:] = 0  # row 2 has no padding
    if padding == "left":
        ids = ids.flip(1)
    elif padding == "scattered":
        ids[2, 3] = 0
    return ids


def test_pack_and_unpack_are_inverse_on_real_tokens() -> None:
    mask = torch.tensor([[True, True, False], [True, False, False], [True, True, True]])
    packing = TokenPacking(mask)
    assert packing.lengths == [2, 1, 3] and packing.is_prefix
    assert not TokenPacking(mask.flip(1)).is_prefix
    x = torch.randn(3, 3, 5)
    packed = packing.pack(x)
    assert packed.shape == (6, 5) and packing.num_tokens == 6
    torch.testing.assert_close(packed, x[mask])
    restored = packing.unpack(packed)
    torch.testing.assert_close(restored[mask], x[mask], rtol=0, atol=0)
    assert not restored[~mask].any()


@pytest.mark.parametrize(
    "batch, shortest, longest, width, expected",
    [(16, 5, 10, 64, False), (32, 10, 40, 256, False), (32, 10, 62, 384, True), (8, 240, 330, 384, True)],
    ids=["statements-width-64", "short-width-256", "reviews-minilm", "documents-minilm"],
)
def test_attention_goes_by_sequence_where_the_padding_costs_more_than_the_calls(
    monkeypatch, batch, shortest, longest, width, expected
) -> None:
    monkeypatch.setattr(packing_module, "PADDING_WORK_PER_CALL", 400_000)  # the shipped value
    lengths = torch.linspace(shortest, longest, batch).round().long()
    packing = TokenPacking(torch.arange(longest)[None, :] < lengths[:, None])
    assert packing.attend_by_sequence(width) is expected


def test_packing_applies_only_to_bool_padding_masks_with_padding() -> None:
    assert TokenPacking.for_padding(None) is None
    assert TokenPacking.for_padding(torch.ones(2, 3, dtype=torch.bool)) is None
    assert TokenPacking.for_padding(torch.zeros(2, 3)) is None  # additive float mask
    assert TokenPacking.for_padding(torch.tensor([[True, False]])) is not None
    with pytest.raises(ValueError, match=r"\[B, T\] bool mask"):
        TokenPacking(torch.ones(2, 3))
    packing = TokenPacking(torch.tensor([[True, False]]))
    with pytest.raises(ValueError, match=r"pack expects \[B, T, C\]"):
        packing.pack(torch.zeros(2, 2, 4))
    with pytest.raises(ValueError, match="unpack expects"):
        packing.unpack(torch.zeros(3, 4))


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"norm_first": True},
        {"position": "rotary"},
        {"position": "learned", "type_vocab_size": 2, "embedding_norm": True, "final_norm": False},
    ],
    ids=["post-norm", "pre-norm", "rotary", "bert-like"],
)
@pytest.mark.parametrize("padding", ["right", "left", "scattered"])
def test_real_tokens_and_their_weights_match_every_position_mode(options, padding) -> None:
    skipping, every = _pair(**options)
    ids = _ids(padding)
    real = ids != 0
    with torch.no_grad():
        ours, our_weights = skipping.eval()(ids, output_attentions=True)
        theirs, their_weights = every.eval()(ids, output_attentions=True)
        fused = skipping(ids).last_hidden_state
    torch.testing.assert_close(ours[real], theirs[real], rtol=0, atol=1e-5)
    torch.testing.assert_close(fused, ours, rtol=0, atol=1e-5)
    assert not ours[~real].any() and not fused[~real].any()
    assert theirs[~real].abs().sum() > 0  # the comparison mode really computes padding
    rows = real[:, None, :].expand(-1, HEADS, -1)
    for name in our_weights.keys():
        torch.testing.assert_close(our_weights[name][rows], their_weights[name][rows], rtol=0, atol=1e-6)
        assert not our_weights[name][~rows].any()


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_gradients_match_every_position_mode(norm_first) -> None:
    skipping, every = _pair(norm_first=norm_first)
    ids = _ids()
    real = ids != 0
    target = torch.randn(*ids.shape, E)
    head_mask = torch.tensor([1.0, 0.5, 0.0, 1.0])
    for model in (skipping.train(), every.train()):
        hidden = model(ids, head_mask=head_mask).last_hidden_state
        (hidden * target)[real].sum().backward()
    for (name, ours), (_, theirs) in zip(skipping.named_parameters(), every.named_parameters()):
        assert ours.grad is not None and torch.isfinite(ours.grad).all(), name
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_a_sequence_made_only_of_padding_stays_finite() -> None:
    skipping, _ = _pair()
    ids = _ids()
    ids[1] = 0
    hidden = skipping.train()(ids).last_hidden_state
    assert torch.isfinite(hidden).all() and not hidden[1].any()
    hidden[ids != 0].square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in skipping.parameters() if p.grad is not None)


def test_sparse_attention_layers_compute_every_position() -> None:
    skipping, every = _pair(attention="sparse", block_size=4)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(skipping.eval()(ids)[0], every.eval()(ids)[0], rtol=0, atol=0)


def test_captured_weights_keep_the_padded_layout() -> None:
    skipping, _ = _pair()
    ids = _ids()
    with capture_attention(skipping) as captured, torch.no_grad():
        skipping(ids)
    weights = captured.attentions["layer_1"]
    assert weights.shape == (4, HEADS, 9, 9)
    real = ids != 0
    rows = real[:, None, :].expand(-1, HEADS, -1)
    torch.testing.assert_close(weights.sum(-1)[rows], torch.ones(int(real.sum()) * HEADS))


def test_packed_attention_rejects_what_it_cannot_do() -> None:
    mha = MultiHeadAttention(E, HEADS, 0.0)
    packing = TokenPacking(torch.tensor([[True, True, False]]))
    x = torch.randn(2, E)
    with pytest.raises(ValueError, match="self-attention only"):
        mha(x, x, x.clone(), packing=packing)
    wrong = torch.randn(3, E)
    with pytest.raises(ValueError, match=r"packed \[N, E\] = \[2, 32\]"):
        mha(wrong, wrong, wrong, packing=packing)
    with pytest.raises(ValueError, match="constraints in mask"):
        mha(x, x, x, attention_mask=torch.ones(1, 3, dtype=torch.bool), packing=packing)


def test_skip_padding_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="skip_padding must be True or False"):
        TransformerEncoder(VOCAB, d_model=E, num_layers=1, num_heads=HEADS, d_ff=FF, skip_padding="yes")


@pytest.mark.parametrize("need_weights", [False, True])
def test_packed_attention_with_an_extra_mask_matches_the_padded_module(need_weights) -> None:
    torch.manual_seed(2)
    mha = MultiHeadAttention(E, HEADS, 0.0, rotary=True).eval()
    real = _ids("left") != 0
    packing = TokenPacking(real)
    x = torch.randn(*real.shape, E)
    causal = torch.ones(real.shape[1], real.shape[1], dtype=torch.bool).tril()
    packed = packing.pack(x)
    out, weights = mha(packed, packed, packed, causal, packing=packing, need_weights=need_weights)
    padded = causal[None, None] & real[:, None, None, :]
    expected, expected_weights = mha(x, x, x, padded, need_weights=need_weights)
    assert out.shape == (packing.num_tokens, E)
    torch.testing.assert_close(out, expected[real], rtol=0, atol=1e-5)
    if need_weights:
        rows = real[:, None, :].expand(-1, HEADS, -1)
        torch.testing.assert_close(weights[rows], expected_weights[rows], rtol=0, atol=1e-6)


def test_wrapped_layers_run_on_the_padded_layout() -> None:
    # Regression: the encoder once passed `packing=` to every layer and read
    # `layer.self_attn`, breaking layers wrapped by the user (e.g. for checkpointing).
    class Wrapped(torch.nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.inner = layer

        def forward(self, x, mask=None, *, need_weights=False, head_mask=None):
            return self.inner(x, mask, need_weights=need_weights, head_mask=head_mask)

    skipping, every = _pair()
    skipping.layers = torch.nn.ModuleList(Wrapped(layer) for layer in skipping.layers)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(skipping.eval()(ids)[0], every.eval()(ids)[0], rtol=0, atol=0)
