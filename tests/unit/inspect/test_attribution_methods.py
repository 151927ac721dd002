"""Each attribution method against a hand-computed case or a reference implementation."""

from __future__ import annotations

import warnings

import networkx as nx
import pytest
import torch

from attnlab import TransformerEncoder
from attnlab.inspect.compute.attention_flow import attention_flow
from attnlab.inspect.compute.attention_scores import raw_attention_scores, rollout_scores
from attnlab.inspect.compute.attribution_target import query_weights, resolve_target
from attnlab.inspect.compute.gradient_rollout import attention_gradients, gradient_weighted_rollout
from attnlab.inspect.compute.integrated_gradients import integrated_gradients
from attnlab.inspect.compute.rollout import attention_rollout
from attnlab.inspect.compute.token_attribution import METHODS, attribute_tokens
from attnlab.models.classifier import EncoderClassifier


def _classifier(pooling: str = "mean", seed: int = 0) -> EncoderClassifier:
    torch.manual_seed(seed)
    encoder = TransformerEncoder(30, d_model=16, num_layers=2, num_heads=4, d_ff=32, pad_id=0)
    return EncoderClassifier(encoder, 3, pooling=pooling, label_names=["neg", "neu", "pos"]).eval()


IDS = torch.tensor([[2, 5, 6, 7, 8, 3]])


def _random_attention(L=3, B=1, H=2, T=4, seed=0):
    torch.manual_seed(seed)
    return [torch.softmax(2 * torch.randn(B, H, T, T), -1) for _ in range(L)]


def test_query_weights_follow_the_pooling():
    mask = torch.tensor([[True, True, True, False]])
    assert query_weights(_classifier("first"), mask).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert torch.allclose(
        query_weights(_classifier("mean"), mask), torch.tensor([[1 / 3, 1 / 3, 1 / 3, 0.0]])
    )


def test_raw_is_the_pooled_row_of_the_last_layer_head_mean():
    first = torch.tensor([[[[0.5, 0.5], [1.0, 0.0]], [[0.1, 0.9], [0.3, 0.7]]]])  # [1, 2, 2, 2]
    last = torch.tensor([[[[0.2, 0.8], [0.6, 0.4]], [[0.4, 0.6], [0.0, 1.0]]]])
    # head mean of the last layer: [[0.3, 0.7], [0.3, 0.7]]
    assert torch.allclose(
        raw_attention_scores([first, last], torch.tensor([[1.0, 0.0]])), torch.tensor([[0.3, 0.7]])
    )
    assert torch.allclose(
        raw_attention_scores([first, last], torch.tensor([[0.5, 0.5]])), torch.tensor([[0.3, 0.7]])
    )


def test_rollout_scores_are_the_rollout_row():
    layers = _random_attention()
    expected = attention_rollout(layers)[-1][:, 0]
    assert torch.allclose(rollout_scores(layers, torch.tensor([[1.0, 0, 0, 0]])), expected)


def test_flow_one_layer_equals_the_mixed_attention_row():
    # one layer, head mean [[0.8, 0.2], [0.4, 0.6]]; mixed with I at 0.5: [[0.9, 0.1], [0.2, 0.8]]
    attention = torch.tensor([[[[0.8, 0.2], [0.4, 0.6]]]])
    flows = attention_flow([attention], torch.tensor([[1.0, 0.0]]))
    assert torch.allclose(flows, torch.tensor([[0.9, 0.1]]), atol=1e-6)


def test_flow_two_layers_takes_the_bottleneck_of_each_path():
    # From input s, paths go s -> (1, t) -> (2, 0): flow = sum_t min(A1'[t, s], A2'[0, t]).
    torch.manual_seed(1)
    a1, a2 = torch.softmax(torch.randn(1, 1, 3, 3), -1), torch.softmax(torch.randn(1, 1, 3, 3), -1)
    eye = torch.eye(3)
    m1, m2 = 0.5 * a1[0, 0] + 0.5 * eye, 0.5 * a2[0, 0] + 0.5 * eye
    expected = torch.stack([torch.minimum(m1[:, s], m2[0]).sum() for s in range(3)])
    flows = attention_flow([a1, a2], torch.tensor([[1.0, 0.0, 0.0]]))
    assert torch.allclose(flows[0], expected, atol=1e-6)
    assert not torch.allclose(flows[0], attention_rollout([a1, a2])[-1][0, 0])  # flow is not rollout


def test_flow_matches_networkx_max_flow():
    layers = _random_attention(L=3, T=5, seed=3)
    pooled = torch.tensor([[0.2, 0.2, 0.2, 0.2, 0.2]])
    flows = attention_flow(layers, pooled)
    T = 5
    graph = nx.DiGraph()
    for l, weights in enumerate(layers):
        mixed = 0.5 * weights[0].double().mean(0) + 0.5 * torch.eye(T, dtype=torch.float64)
        mixed = mixed / mixed.sum(-1, keepdim=True)
        for t in range(T):
            for s in range(T):
                graph.add_edge((l, s), (l + 1, t), capacity=float(mixed[t, s]))
    for t in range(T):
        graph.add_edge((3, t), "sink", capacity=0.2)
    reference = [nx.maximum_flow_value(graph, (0, s), "sink") for s in range(T)]
    assert torch.allclose(flows[0].double(), torch.tensor(reference, dtype=torch.float64), atol=1e-5)


def test_flow_gives_padding_nothing():
    layers = _random_attention(T=4)
    mask = torch.tensor([[True, True, True, False]])
    flows = attention_flow(layers, torch.tensor([[1.0, 0, 0, 0]]), mask)
    assert flows[0, 3] == 0 and flows[0, :3].min() > 0


def test_grad_attention_hand_computed():
    A = torch.tensor([[[[0.6, 0.4], [0.3, 0.7]], [[0.5, 0.5], [0.9, 0.1]]]])  # [1, 2, 2, 2]
    G = torch.tensor([[[[1.0, -2.0], [0.5, 1.0]], [[-1.0, 2.0], [0.0, 1.0]]]])
    # (G * A)^+ head 1: [[0.6, 0], [0.15, 0.7]]; head 2: [[0, 1.0], [0, 0.1]]; mean: [[0.3, 0.5], [0.075, 0.4]]
    # R = I + Abar = [[1.3, 0.5], [0.075, 1.4]]; row 0
    scores = gradient_weighted_rollout([A], [G], torch.tensor([[1.0, 0.0]]))
    assert torch.allclose(scores, torch.tensor([[1.3, 0.5]]))
    # two layers: R2 = R1 + Abar R1 with the same map: R1 + Abar @ R1
    abar = torch.tensor([[0.3, 0.5], [0.075, 0.4]])
    r1 = torch.eye(2) + abar
    scores = gradient_weighted_rollout([A, A], [G, G], torch.tensor([[1.0, 0.0]]))
    assert torch.allclose(scores[0], (r1 + abar @ r1)[0])


def test_relevance_maps_are_weighted_by_the_gradient_hand_computed():
    # the relevance rule weights each map's LRP relevance (tests/unit/inspect/test_lrp_relevance.py)
    R = torch.tensor([[[[0.2, -0.1], [0.3, 0.4]]]])
    G = torch.tensor([[[[1.0, -2.0], [0.5, 1.0]]]])
    # (G * R)^+ = [[0.2, 0.2], [0.15, 0.4]]: negative relevance with a negative gradient counts
    scores = gradient_weighted_rollout([R], [G], torch.tensor([[0.5, 0.5]]))
    rows = torch.eye(2) + torch.tensor([[0.2, 0.2], [0.15, 0.4]])
    assert torch.allclose(scores[0], rows.mean(0))


def test_attention_gradients_match_autograd_through_output_attentions():
    model = _classifier()
    found = attention_gradients(model, IDS)
    out = model(IDS, output_attentions=True)
    target = out.logits.argmax(-1)
    reference = torch.autograd.grad(out.logits[0, target[0]], list(out.attentions))
    assert found.target.tolist() == target.tolist()
    for ours, theirs in zip(found.gradients, reference):
        assert torch.allclose(ours, theirs, atol=1e-6)


def test_integrated_gradients_matches_captum_and_is_complete():
    pytest.importorskip("captum")
    model = _classifier()
    ours = integrated_gradients(model, IDS, target=1, steps=32)
    theirs = integrated_gradients(model, IDS, target=1, steps=32, backend="captum")
    assert torch.allclose(ours.attributions, theirs.attributions, atol=1e-5)
    assert abs(float(ours.delta[0])) < 1e-3  # scores sum to y(x) - y(baseline)


def test_integrated_gradients_take_captums_per_example_target_tensor():
    # Regression: target=torch.tensor([0, 2]) (one class per row, as captum takes it) was refused.
    captum = pytest.importorskip("captum.attr")
    model = _classifier()
    ids = torch.tensor([[2, 5, 6, 7, 8, 3], [2, 9, 4, 3, 0, 0]])
    mask = ids != 0
    rows = torch.tensor([0, 2])
    ours = integrated_gradients(model, ids, target=rows, mask=mask, steps=32)
    method = captum.LayerIntegratedGradients(lambda x: model(x, mask=mask.repeat(x.shape[0] // 2, 1)).logits,
                                             model.encoder.embedding)
    with warnings.catch_warnings():  # the baseline is pad ids under the input's mask, on purpose
        warnings.simplefilter("ignore", UserWarning)
        theirs = method.attribute(ids, baselines=torch.zeros_like(ids), target=rows, n_steps=32)
    assert ours.target.tolist() == [0, 2]
    assert torch.allclose(ours.attributions, theirs.float(), atol=1e-5)
    assert torch.allclose(integrated_gradients(model, ids, target=[0, 2], mask=mask, steps=32).attributions,
                          ours.attributions)
    with pytest.raises(ValueError, match="one class per example: 2 values, got 3"):
        integrated_gradients(model, ids, target=torch.tensor([0, 1, 2]), mask=mask)
    with pytest.raises(ValueError, match=r"0\.\.2"):
        integrated_gradients(model, ids, target=torch.tensor([0, 3]), mask=mask)


def test_integrated_gradients_on_a_linear_model_is_input_times_weight():
    # embedding -> mean over tokens -> linear: IG = (x - x') . w / T exactly
    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = TransformerEncoder(10, d_model=4, num_layers=1, num_heads=1, d_ff=4, pad_id=0)
            self.head = torch.nn.Linear(4, 2)

        def forward(self, ids, mask=None):
            return (self.head(self.encoder.embedding(ids).mean(1)),)

    model = Linear()
    ids = torch.tensor([[3, 4, 5]])
    result = integrated_gradients(model, ids, target=0, steps=4)
    expected = (
        (model.encoder.embedding(ids) - model.encoder.embedding(torch.zeros_like(ids)))
        @ model.head.weight[0]
        / 3
    )
    assert torch.allclose(result.scores, expected.detach(), atol=1e-6)


def test_target_by_name_and_bad_targets():
    logits = torch.tensor([[0.1, 0.5, 0.2]])
    assert resolve_target(logits, "pos", ["neg", "neu", "pos"]).tolist() == [2]
    assert resolve_target(logits, None).tolist() == [1]
    with pytest.raises(ValueError, match="not a class"):
        resolve_target(logits, "happy", ["neg", "neu", "pos"])
    with pytest.raises(ValueError, match="0..2"):
        resolve_target(logits, 3)


@pytest.mark.parametrize("pooling", ["mean", "first"])
def test_every_method_gives_one_finite_score_per_token(pooling):
    result = attribute_tokens(_classifier(pooling), IDS, METHODS, target="pos")
    assert list(result.scores) == list(METHODS)
    for scores in result.scores.values():
        assert scores.shape == IDS.shape and torch.isfinite(scores).all()
    assert result.target.tolist() == [2]


def test_a_bare_encoder_takes_the_attention_methods_only():
    encoder = _classifier().encoder
    result = attribute_tokens(encoder, IDS, ["raw", "rollout", "flow"])
    assert set(result.scores) == {"raw", "rollout", "flow"} and result.target is None
    with pytest.raises(TypeError, match="logits"):
        attribute_tokens(encoder, IDS, ["grad-attention"])
    with pytest.raises(ValueError, match="unknown attribution method 'lime'"):
        attribute_tokens(encoder, IDS, ["lime"])


def _uniform_causal_decoder(num_layers: int = 2):
    """A tiny decoder whose queries are zero: each position attends uniformly to its prefix."""
    from attnlab.layers.decoder_config import DecoderConfig
    from attnlab.models.decoder import DecoderForCausalLM

    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=40, d_model=16, num_layers=num_layers, num_heads=2, d_ff=32, num_kv_heads=2)
    model = DecoderForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.layers:
            projection = layer.self_attn.qkv_proj
            queries = config.num_heads * (config.d_model // config.num_heads)
            projection.weight[:queries] = 0.0
            if projection.bias is not None:
                projection.bias[:queries] = 0.0
    return model


def test_a_causal_decoder_is_explained_at_its_last_token_not_row_0():
    # Regression: raw, rollout and flow read row 0, which in a causal model attends only to
    # itself, so every decoder came out [1, 0, 0, ...].
    model = _uniform_causal_decoder()
    T = 5
    ids = torch.tensor([[1, 5, 7, 9, 11]])
    result = attribute_tokens(model, ids, ["raw", "rollout", "flow"])
    # zero queries: the last token attends uniformly to all T positions
    assert torch.allclose(result.scores["raw"], torch.full((1, T), 1 / T), atol=1e-6)
    # rollout by hand: 0.5 * uniform causal attention + 0.5 * identity, per layer, then the last row
    causal = torch.tril(torch.ones(T, T, dtype=torch.float64))
    mixed = 0.5 * causal / causal.sum(-1, keepdim=True) + 0.5 * torch.eye(T, dtype=torch.float64)
    expected = (mixed @ mixed)[-1].float()
    assert torch.allclose(result.scores["rollout"][0], expected, atol=1e-6)
    assert (result.scores["flow"][0] > 0).all()
    assert query_weights(model, torch.tensor([[True, True, True, False]])).tolist() == [[0.0, 0.0, 1.0, 0.0]]
