"""``beyond_window``: the mass each causal layer puts on keys a sliding window leaves out,
against a loop over rows, on both doors' sites (their windows read from the model)."""

from __future__ import annotations

import pytest
import torch
import transformers

from attnlab.hf.opening import TransformersModel
from attnlab.inspect.compute.causal_statistics import CausalStatistics, causal_statistics, describe_window
from attnlab.inspect.compute.inspectable import inspectable, sliding_window
from attnlab.layers.decoder_config import DecoderConfig
from attnlab.models.decoder import DecoderForCausalLM


def _loop(weights: torch.Tensor, keep: torch.Tensor, window: int) -> list[float]:
    """Per head: the mean over real rows t >= window of the mass on real keys s <= t - window."""
    B, H, T, S = weights.shape
    result = []
    for h in range(H):
        values = [sum(float(weights[b, h, t, s]) for s in range(S) if keep[b, s] and t - s >= window)
                  for b in range(B) for t in range(T) if keep[b, t] and t >= window]
        result.append(sum(values) / len(values))
    return result


def test_beyond_window_equals_a_loop_over_rows_with_padding():
    torch.manual_seed(0)
    weights = torch.softmax(torch.randn(2, 3, 12, 12), -1).tril()
    keep = torch.ones(2, 12, dtype=torch.bool)
    keep[1, :3] = False  # left padding
    got = causal_statistics({"layer_1": weights}, keep, window=4)["beyond_window"]["layer_1"]
    assert got == pytest.approx(_loop(weights, keep, 4), abs=1e-12)
    assert "beyond_window" not in causal_statistics({"layer_1": weights}, keep)  # no window, not measured


def test_blocks_of_rows_and_saved_states_give_the_same_means():
    torch.manual_seed(1)
    weights = torch.softmax(torch.randn(1, 2, 10, 10), -1)
    whole = causal_statistics({"layer_1": weights}, window=3)["beyond_window"]["layer_1"]
    blocks = CausalStatistics(window=3)
    blocks.update("layer_1", weights[:, :, :6], first_query=0)
    resumed = CausalStatistics(window=3)
    resumed.load_state(blocks.state())
    resumed.update("layer_1", weights[:, :, 6:], first_query=6)
    assert resumed.means()["beyond_window"]["layer_1"] == pytest.approx(whole, abs=1e-12)


def test_the_line_names_local_and_global_layers():
    line = describe_window({"layer_1": [0.0, 0.0], "layer_2": [0.0, 0.0], "layer_3": [0.2, 0.4],
                            "layer_4": [0.0, 0.0]}, 8)
    assert line == ("sliding window 8 tokens: layers 1-2, 4 put exactly 0 beyond it; layer 3 put 0.2-0.4 "
                    "of each row there (head means)")
    assert "not measured" in describe_window({"layer_1": [None, None]}, 8)


def test_a_transformers_gemma3_measures_its_window_exactly_zero_on_local_layers():
    config = transformers.Gemma3TextConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=4, query_pre_attn_scalar=8,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(0)
    model = TransformersModel(transformers.Gemma3ForCausalLM(config).eval())
    assert [site.window for site in model.attention_sites()] == [4, None]
    assert sliding_window(model.attention_sites()) == 4
    with torch.no_grad(), model.statistics() as recorder:
        model(torch.randint(3, 40, (2, 16)))
    beyond = recorder.causal_means()["beyond_window"]
    assert beyond["layer_1"] == [0.0] * 4 and min(beyond["layer_2"]) > 0.1


def test_a_mistral_window_applies_to_every_layer():
    config = transformers.MistralConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, sliding_window=5)
    model = TransformersModel(transformers.MistralForCausalLM(config).eval())
    assert [site.window for site in model.attention_sites()] == [5, 5]


def test_attnlabs_own_decoder_gives_its_window_to_every_site():
    torch.manual_seed(0)
    decoder = DecoderForCausalLM(DecoderConfig(vocab_size=30, d_model=16, num_layers=2, num_heads=2, d_ff=32,
                                               sliding_window=3)).eval()
    view = inspectable(decoder)
    assert [site.window for site in view.attention_sites()] == [3, 3]
    with torch.no_grad(), view.statistics() as recorder:
        view(torch.randint(0, 30, (1, 12)))
    assert all(value == 0.0 for heads in recorder.causal_means()["beyond_window"].values() for value in heads)
