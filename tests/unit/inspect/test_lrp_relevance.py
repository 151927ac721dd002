"""Chefer, Gur & Wolf's LRP relevance (CVPR 2021): each rule by hand, conservation, and the
whole propagation against a second implementation of their ``generate_LRP``.

The second implementation (``_reference_*`` below) is written the way their code is:
every gradient x input step through ``torch.autograd.grad`` with the relevance over the
output as the output gradient, their ``safe_divide`` verbatim, residual sums over the
whole (one-example) tensor, and the layer order of their ``BERT.py`` (post-norm) and
ViT block (pre-norm). It shares no code with ``attnlab.inspect.compute.lrp``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab import TransformerEncoder
from attnlab.attention.disentangled import DisentangledSelfAttention, RelativePositionTable
from attnlab.attention.position_bias import RelativePositionBias
from attnlab.inspect.compute.gradient_rollout import gradient_weighted_rollout
from attnlab.inspect.compute.lrp import attention_relevance
from attnlab.inspect.compute.lrp_rules import (
    add_relevance,
    clone_relevance,
    first_token_relevance,
    linear_relevance,
    matmul_relevance,
    mean_pool_relevance,
)
from attnlab.inspect.compute.token_attribution import attribute_tokens
from attnlab.layers import GatedFFN
from attnlab.layers.encoder_layer import TransformerEncoderLayer
from attnlab.models.classifier import EncoderClassifier

f64 = torch.float64
IDS = torch.tensor([[2, 5, 6, 7, 8, 9, 3]])


# ---- the rules by hand ---------------------------------------------------------------


def test_linear_rule_hand_computed():
    # x = [1, -2], W = [[2, 1], [1, -3]], relevance of the outputs [3, 14].
    # Output 0: contributions x_i w_0i = 2 (positive) and -2 (negative input x positive
    #   weight: dropped by alpha-1-beta-0), so input 0 takes all 3.
    # Output 1: contributions 1 (positive x positive) and 6 (negative x negative), both
    #   kept: input 0 takes 14 * 1/7 = 2, input 1 takes 14 * 6/7 = 12.
    # Inputs: [3 + 2, 12] = [5, 12]; the total 17 is kept.
    x = torch.tensor([[1.0, -2.0]], dtype=f64)
    weight = torch.tensor([[2.0, 1.0], [1.0, -3.0]], dtype=f64)
    relevance = linear_relevance(x, weight, torch.tensor([[3.0, 14.0]], dtype=f64))
    assert torch.allclose(relevance, torch.tensor([[5.0, 12.0]], dtype=f64), atol=1e-6)


def test_matmul_rule_hand_computed():
    # a = [[1, 2]], b = [[3], [4]]: a b = 11, relevance 22, so S = R / (a b) = 2.
    # R_a = a * (S b^T) / 2 = [1 * 6, 2 * 8] / 2 = [3, 8];
    # R_b = b * (a^T S) / 2 = [3 * 2, 4 * 4] / 2 = [3, 8]; together 22.
    a = torch.tensor([[1.0, 2.0]], dtype=f64)
    b = torch.tensor([[3.0], [4.0]], dtype=f64)
    relevance_a, relevance_b = matmul_relevance(a, b, torch.tensor([[22.0]], dtype=f64))
    assert torch.allclose(relevance_a, torch.tensor([[3.0, 8.0]], dtype=f64), atol=1e-6)
    assert torch.allclose(relevance_b, torch.tensor([[3.0], [8.0]], dtype=f64), atol=1e-6)


def test_add_rule_hand_computed():
    # a = [2, 3], b = [-1, 1], a + b = [1, 4], relevance [2, 4]: S = [2, 1].
    # Shares: a S = [4, 3] (total 7), b S = [-2, 1] (total -1); incoming total 6.
    # a's part of 6: 7 / (7 + 1) * 6 = 5.25, so R_a = [4, 3] * 5.25 / 7 = [3, 2.25];
    # b's part: 1 / 8 * 6 = 0.75, so R_b = [-2, 1] * 0.75 / -1 = [1.5, -0.75].
    a = torch.tensor([[2.0, 3.0]], dtype=f64)
    b = torch.tensor([[-1.0, 1.0]], dtype=f64)
    relevance_a, relevance_b = add_relevance(a, b, torch.tensor([[2.0, 4.0]], dtype=f64))
    assert torch.allclose(relevance_a, torch.tensor([[3.0, 2.25]], dtype=f64), atol=1e-6)
    assert torch.allclose(relevance_b, torch.tensor([[1.5, -0.75]], dtype=f64), atol=1e-6)


def test_clone_and_pooling_rules_hand_computed():
    # a tensor used twice takes both relevances, except where it is exactly 0
    x = torch.tensor([[2.0, 0.0]], dtype=f64)
    summed = clone_relevance(x, [torch.tensor([[1.0, 5.0]], dtype=f64), torch.tensor([[3.0, 1.0]], dtype=f64)])
    assert torch.allclose(summed, torch.tensor([[4.0, 0.0]], dtype=f64), atol=1e-6)
    # hidden [1, 2, 1] = [[4], [2]]; the mean 3 has relevance 6: token 0 contributed 4 / 2 = 2
    # of 3, so takes 4; token 1 takes 2. First-token pooling gives it all to token 0.
    hidden = torch.tensor([[[4.0], [2.0]]], dtype=f64)
    pooled = torch.tensor([[6.0]], dtype=f64)
    mean = mean_pool_relevance(hidden, None, pooled)
    assert torch.allclose(mean, torch.tensor([[[4.0], [2.0]]], dtype=f64), atol=1e-6)
    assert torch.allclose(first_token_relevance(hidden, pooled), torch.tensor([[[6.0], [0.0]]], dtype=f64))


# ---- conservation ---------------------------------------------------------------------


def test_linear_rule_conserves_with_positive_inputs_and_no_bias():
    torch.manual_seed(0)
    x = torch.rand(3, 5, dtype=f64) + 0.1  # positive inputs
    weight = torch.randn(4, 5, dtype=f64)
    weight[:, 0] = weight[:, 0].abs()  # every output has a positive contribution
    relevance = torch.rand(3, 4, dtype=f64)
    found = linear_relevance(x, weight, relevance)
    assert torch.allclose(found.sum(-1), relevance.sum(-1), atol=1e-8)
    assert (found >= 0).all()  # alpha-1-beta-0 with positive relevance never goes negative


def test_add_matmul_and_clone_rules_conserve_each_example():
    torch.manual_seed(1)
    a, b, relevance = (torch.randn(2, 3, 4, dtype=f64) for _ in range(3))
    relevance_a, relevance_b = add_relevance(a, b, relevance)
    assert torch.allclose((relevance_a + relevance_b).sum((1, 2)), relevance.sum((1, 2)), atol=1e-8)
    q, k = torch.randn(2, 3, 5, dtype=f64), torch.randn(2, 5, 4, dtype=f64)
    relevance_q, relevance_k = matmul_relevance(q, k, relevance)
    assert torch.allclose(relevance_q.sum((1, 2)) + relevance_k.sum((1, 2)), relevance.sum((1, 2)), atol=1e-8)
    assert torch.allclose(relevance_q.sum((1, 2)), relevance.sum((1, 2)) / 2, atol=1e-8)
    assert torch.allclose(clone_relevance(a, [relevance, b]).sum(), (relevance + b).sum(), atol=1e-6)


@pytest.mark.parametrize("norm_first, pooling", [(False, "first"), (True, "mean")])
def test_the_whole_network_conserves_the_start(norm_first, pooling):
    model = _classifier(norm_first=norm_first, pooling=pooling, pooler={"activation": "tanh"})
    found = attention_relevance(model, IDS)
    # relevance 1 starts on the explained class; every rule on the way keeps the total
    assert torch.allclose(found.input_relevance.sum((1, 2)), torch.ones(1, dtype=f64), atol=1e-6)


# ---- the whole propagation against their generate_LRP ---------------------------------


def _classifier(*, norm_first=False, pooling="first", pooler=None, score_bias=False, seed=0):
    torch.manual_seed(seed)
    bias = RelativePositionBias(4, 32) if score_bias else None
    encoder = TransformerEncoder(
        30, d_model=16, num_layers=2, num_heads=4, d_ff=32, pad_id=0, norm_first=norm_first, score_bias=bias
    )
    model = EncoderClassifier(encoder, 3, pooling=pooling, pooler=pooler).double().eval()
    with torch.no_grad():  # biases and norm parameters away from 0 and 1, so they count
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return model


def _their_safe_divide(a, b):
    den = b.clamp(min=1e-9) + b.clamp(max=1e-9)
    den = den + den.eq(0).type(den.type()) * 1e-9
    return a / den * b.ne(0).type(b.type())


def _reference_gradient_x_input(function, inputs, relevance):
    """Their RelPropSimple: each input times the gradient of <Z, R / Z>."""
    inputs = [x.detach().requires_grad_(True) for x in inputs]
    with torch.enable_grad():
        z = function(*inputs)
        gradients = torch.autograd.grad(z, inputs, _their_safe_divide(relevance, z.detach()))
    return [x.detach() * g for x, g in zip(inputs, gradients)]


def _reference_linear(x, weight, relevance):
    """Their Linear.relprop with alpha = 1 (beta = 0)."""
    pw, nw = torch.clamp(weight, min=0), torch.clamp(weight, max=0)
    px = torch.clamp(x, min=0).detach().requires_grad_(True)
    nx = torch.clamp(x, max=0).detach().requires_grad_(True)
    with torch.enable_grad():
        z1, z2 = F.linear(px, pw), F.linear(nx, nw)
        s = _their_safe_divide(relevance, (z1 + z2).detach())
        c1 = px * torch.autograd.grad(z1, px, s, retain_graph=True)[0]
        c2 = nx * torch.autograd.grad(z2, nx, s)[0]
    return (c1 + c2).detach()


def _reference_add(a, b, relevance):
    """Their Add.relprop (one example: sums over the whole tensor)."""
    ra, rb = _reference_gradient_x_input(torch.add, [a, b], relevance)
    a_sum, b_sum = ra.sum(), rb.sum()
    a_fact = _their_safe_divide(a_sum.abs(), a_sum.abs() + b_sum.abs()) * relevance.sum()
    b_fact = _their_safe_divide(b_sum.abs(), a_sum.abs() + b_sum.abs()) * relevance.sum()
    return ra * _their_safe_divide(a_fact, ra.sum()), rb * _their_safe_divide(b_fact, rb.sum())


def _reference_clone(x, relevances):
    """Their Clone.relprop: x * sum_i R_i / x."""
    return x * sum(_their_safe_divide(r, x) for r in relevances)


def _reference_generate_lrp(model, ids):
    """Their generate_LRP, one example: (scores [T], relevance of each map [1, H, T, T])."""
    out = model(ids, output_attentions=True, output_hidden_states=True)
    target = int(out.logits.argmax(-1))
    gradients = torch.autograd.grad(out.logits[0, target], list(out.attentions))
    encoder, T = model.encoder, ids.shape[1]
    H = encoder.config.num_heads
    D = encoder.config.d_model // H
    bias = None if encoder.score_bias is None else encoder.score_bias(T, T).detach()

    with torch.no_grad():
        hidden = out.last_hidden_state.detach()  # [1, T, E]
        pooled = hidden[:, 0] if model.pooling == "first" else hidden.mean(1)
        features = pooled if model.pooler is None else model.pooler(pooled)
    relevance = F.one_hot(torch.tensor([target]), 3).double()  # what generate_LRP hands to relprop
    relevance = _reference_linear(features, model.classifier.weight, relevance)
    if model.pooler is not None:  # tanh (and a LayerNorm) pass relevance through
        relevance = _reference_linear(pooled, model.pooler.dense.weight, relevance)
    if model.pooling == "first":
        select = lambda h: h.index_select(1, torch.tensor([0])).squeeze(1)
        relevance = _reference_gradient_x_input(select, [hidden], relevance)[0]
    else:
        relevance = _reference_gradient_x_input(lambda h: h.mean(1), [hidden], relevance)[0]

    cams = [None] * len(encoder.layers)
    for index in reversed(range(len(encoder.layers))):
        layer, x = encoder.layers[index], out.hidden_states[index].detach()
        attention = layer.self_attn
        with torch.no_grad():
            n1 = layer.norm1(x) if layer.norm_first else x
            q, k, v = (
                F.linear(n1, w, b).view(1, T, H, D).permute(0, 2, 1, 3)
                for w, b in zip(attention.in_proj_weight.chunk(3), attention.in_proj_bias.chunk(3))
            )
            scores = q @ k.transpose(-1, -2) / math.sqrt(D)
            probs = torch.softmax(scores if bias is None else scores + bias, -1)
            assert torch.allclose(probs, out.attentions[index])
            merged = (probs @ v).permute(0, 2, 1, 3).reshape(1, T, H * D)
            attended = attention.out_proj(merged)
            if layer.norm_first:  # their ViT block
                x1 = x + attended
                n2 = layer.norm2(x1)
                inner = layer.ffn.activation(layer.ffn.linear1(n2))
                ffn_out = layer.ffn.linear2(inner)
            else:  # their BertLayer
                x1 = layer.norm1(x + attended)
                n2 = x1
                inner = layer.ffn.activation(layer.ffn.linear1(x1))
                ffn_out = layer.ffn.linear2(inner)
        # feed-forward half: (LayerNorm passes,) add, dense, activation passes, dense, clone
        relevance_res, relevance_ffn = _reference_add(x1, ffn_out, relevance)
        relevance_ffn = _reference_linear(inner, layer.ffn.linear2.weight, relevance_ffn)
        relevance_ffn = _reference_linear(n2, layer.ffn.linear1.weight, relevance_ffn)
        relevance = _reference_clone(x1, [relevance_res, relevance_ffn])
        # attention half: (LayerNorm passes,) add, output dense, A @ V, softmax passes, Q K^T
        relevance_res, relevance_att = _reference_add(x, attended, relevance)
        relevance_att = _reference_linear(merged, attention.out_proj.weight, relevance_att)
        relevance_context = relevance_att.view(1, T, H, D).permute(0, 2, 1, 3)
        cam, relevance_v = _reference_gradient_x_input(torch.matmul, [probs, v], relevance_context)
        cam, relevance_v = cam / 2, relevance_v / 2
        cams[index] = cam
        if bias is not None:  # as their attention-mask addition
            cam, _ = _reference_add(scores, bias, cam)
        relevance_q, relevance_kt = _reference_gradient_x_input(torch.matmul, [q, k.transpose(-1, -2)], cam)
        heads = (relevance_q / 2, relevance_kt.transpose(-1, -2) / 2, relevance_v)
        through = [
            _reference_linear(n1, w, r.permute(0, 2, 1, 3).reshape(1, T, H * D))
            for w, r in zip(attention.in_proj_weight.chunk(3), heads)
        ]
        relevance = _reference_clone(x, [_reference_clone(n1, through), relevance_res])

    rollout = None  # their compute_rollout_attention from the first layer
    for cam, gradient in zip(cams, gradients):
        layer_map = (gradient[0] * cam[0]).clamp(min=0).mean(0) + torch.eye(T, dtype=f64)
        rollout = layer_map if rollout is None else layer_map @ rollout
    scores = rollout[0] if model.pooling == "first" else rollout.mean(0)
    return scores, cams, gradients, list(out.attentions)


CASES = {
    "post-norm, [CLS], tanh pooler": {"norm_first": False, "pooling": "first", "pooler": {"activation": "tanh"}},
    "pre-norm, mean": {"norm_first": True, "pooling": "mean"},
    "post-norm, mean, score bias": {"norm_first": False, "pooling": "mean", "score_bias": True},
    "pre-norm, [CLS], gelu pooler with norm": {
        "norm_first": True,
        "pooling": "first",
        "pooler": {"activation": "gelu", "norm_eps": 1e-12},
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_relevance_matches_their_generate_lrp(case):
    model = _classifier(**CASES[case], seed=len(case))
    expected_scores, expected_maps, gradients, attentions = _reference_generate_lrp(model, IDS)
    found = attention_relevance(model, IDS)
    for ours, theirs, gradient, weights in zip(found.relevances, expected_maps, gradients, attentions):
        assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-12)
        old_approximation = (weights * gradient).clamp(min=0)
        assert not torch.allclose(ours, old_approximation, atol=1e-3)  # a different quantity
    scores = attribute_tokens(model, IDS, ["relevance"]).scores["relevance"]
    assert torch.allclose(scores[0].double(), expected_scores, rtol=1e-5, atol=1e-7)


def test_each_example_of_a_batch_is_explained_on_its_own():
    model = _classifier(pooling="mean")
    ids = torch.tensor([[2, 5, 6, 7, 3], [2, 9, 9, 4, 3]])
    together = attention_relevance(model, ids, target=1)
    for row in range(2):
        alone = attention_relevance(model, ids[row : row + 1], target=1)
        for ours, single in zip(together.relevances, alone.relevances):
            assert torch.allclose(ours[row : row + 1], single, rtol=1e-9, atol=1e-14)


def test_relevance_and_grad_attention_share_one_forward_and_differ():
    model = _classifier(pooling="mean")
    found = attention_relevance(model, IDS)
    weights = torch.full((1, IDS.shape[1]), 1 / IDS.shape[1])
    result = attribute_tokens(model, IDS, ["grad-attention", "relevance"])
    assert torch.allclose(
        result.scores["grad-attention"], gradient_weighted_rollout(found.attentions, found.gradients, weights)
    )
    assert torch.allclose(
        result.scores["relevance"], gradient_weighted_rollout(found.relevances, found.gradients, weights)
    )
    assert not torch.allclose(result.scores["relevance"], result.scores["grad-attention"])


# ---- what is refused ------------------------------------------------------------------


def _encoder_classifier(**options) -> EncoderClassifier:
    torch.manual_seed(0)
    encoder = TransformerEncoder(30, d_model=16, num_layers=2, num_heads=4, d_ff=32, pad_id=0, **options)
    return EncoderClassifier(encoder, 2).eval()


def test_unsupported_components_are_named():
    with pytest.raises(ValueError, match=r"rotary position embedding \(layer_1\); use grad-attention"):
        attention_relevance(_encoder_classifier(position="rotary"), IDS)
    with pytest.raises(ValueError, match="sparse attention"):
        attention_relevance(_encoder_classifier(attention="sparse", block_size=2), IDS)
    gated = _encoder_classifier(
        layer_factory=lambda index: TransformerEncoderLayer(16, 4, 32, ffn=GatedFFN(16, 32))
    )
    with pytest.raises(ValueError, match="GatedFFN"):
        attention_relevance(gated, IDS)
    deberta = _encoder_classifier()
    table = RelativePositionTable(8, 16)
    deberta.encoder.layers[1].self_attn = DisentangledSelfAttention(16, 4, positions=table, owns_positions=True)
    with pytest.raises(ValueError, match=r"DeBERTa's disentangled attention .*\(layer_2\)"):
        attention_relevance(deberta, IDS)
    with pytest.raises(TypeError, match="EncoderClassifier"):
        attention_relevance(_encoder_classifier().encoder, IDS)


def test_a_forward_the_propagation_does_not_model_fails_loudly():
    model = _encoder_classifier()
    model.encoder.layers[0].ffn.register_forward_hook(lambda module, args, output: 2.0 * output)
    with pytest.raises(RuntimeError, match="the output of layer_1 recomputed"):
        attention_relevance(model, IDS)
