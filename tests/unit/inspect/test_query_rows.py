"""Exact weights of chosen query rows over every key, without the ``[T, S]`` map: against
transformers' eager weights (the same rows of its whole map) and attnlab's own full maps."""

from __future__ import annotations

import pytest
import torch

from attnlab.inspect import capture_attention, inspectable
from attnlab.inspect.compute import query_rows, routing
from attnlab.layers.decoder_config import DecoderConfig
from attnlab.models.decoder import DecoderForCausalLM

transformers = pytest.importorskip("transformers")
from attnlab.hf import attach  # noqa: E402


def _llama(**extra) -> "transformers.LlamaForCausalLM":
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, vocab_size=100,
                                      max_position_embeddings=512, **extra)
    return transformers.LlamaForCausalLM(config).eval()


def _eager(model, ids, mask):
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(ids, attention_mask=mask, output_attentions=True)
    finally:
        model.set_attn_implementation("sdpa")


IDS = torch.randint(0, 100, (2, 48), generator=torch.Generator().manual_seed(1))
MASK = torch.ones(2, 48, dtype=torch.long)
MASK[1, :6] = 0  # left padding: rows 0..5 of the second text are padding


@pytest.mark.parametrize("rows, positions", [
    (4, [44, 45, 46, 47]),
    (slice(10, 20), list(range(10, 20))),
    (range(30, 33), [30, 31, 32]),
    ([6, -1, 17], [6, 47, 17]),
])
def test_chosen_rows_equal_the_rows_of_eager_weights_and_the_output_is_unchanged(rows, positions):
    model = _llama()
    eager = _eager(model, IDS, MASK)
    with attach(model, layers="all", rows=rows) as seen, torch.no_grad():
        out = model(IDS, attention_mask=MASK)
    real = MASK.bool()
    assert (out.logits - eager.logits)[real].abs().max() < 1e-5  # the fused kernel served every row
    for index, name in enumerate(["layer_1", "layer_2"]):
        assert seen.query_rows[name].tolist() == positions
        weights = seen.attentions[name]
        assert weights.shape == (2, 8, len(positions), 48)
        want = eager.attentions[index][:, :, positions]
        # eager spreads a padding row uniformly over masked keys; attnlab gives it zeros
        padding_row = ~real[:, positions][:, None, :, None]
        assert torch.allclose(weights, want.masked_fill(padding_row, 0.0), atol=1e-6)


def test_rows_on_a_sliding_window_model_keep_exact_zeros_past_the_window():
    torch.manual_seed(0)
    config = transformers.MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                        num_attention_heads=8, num_key_value_heads=2, vocab_size=100,
                                        max_position_embeddings=512, sliding_window=8)
    model = transformers.MistralForCausalLM(config).eval()
    ids = IDS[:1]
    eager = _eager(model, ids, None)
    with attach(model, layers="all", rows=[40, 47]) as seen, torch.no_grad():
        model(ids)
    local = seen.attentions["layer_1"]
    assert torch.allclose(local, eager.attentions[0][:, :, [40, 47]], atol=1e-6)
    assert local[0, :, 1, :40].abs().max() == 0  # row 47 sees keys 40..47 only
    assert torch.all(local[0, :, 1, 40:] > 0)


def test_own_decoder_rows_equal_the_rows_of_its_full_maps_and_keep_no_full_map(monkeypatch):
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=30, d_model=32, num_layers=2, num_heads=4, d_ff=64, num_kv_heads=2)
    model = DecoderForCausalLM(config).eval()
    ids = torch.randint(1, 30, (2, 24))
    with torch.no_grad(), capture_attention(model) as whole:
        full_logits = model(ids).logits
    made = []
    exact = query_rows.exact_attention

    def spy(module, query, *args, **kwargs):
        made.append(query.shape[2])
        return exact(module, query, *args, **kwargs)

    monkeypatch.setattr(query_rows, "exact_attention", spy)
    with torch.no_grad(), capture_attention(model, rows=slice(-5, None)) as chosen:
        logits = model(ids).logits
    assert made == [5, 5]  # one call per layer, of the chosen queries only
    assert torch.allclose(logits, full_logits, atol=1e-5)
    for name, weights in whole.attentions.items():
        assert chosen.query_rows[name].tolist() == list(range(19, 24))
        assert torch.allclose(chosen.attentions[name], weights[:, :, 19:], atol=1e-6)
    view = inspectable(model)
    with torch.no_grad(), view.record(layers=["layer_2"], rows=[0]) as seen:
        model(ids)
    assert torch.allclose(seen.attentions["layer_2"], whole.attentions["layer_2"][:, :, :1], atol=1e-6)


def test_rows_are_computed_in_blocks_that_hold_at_most_the_budget(monkeypatch):
    model = _llama()
    eager = _eager(model, IDS, MASK)
    monkeypatch.setattr(routing, "_STATISTICS_BLOCK_CELLS", 2 * 8 * 48 * 3)  # 3 rows a block
    with attach(model, layers=[2], rows=10) as seen, torch.no_grad():
        model(IDS, attention_mask=MASK)
    assert torch.allclose(seen.attentions["layer_2"], eager.attentions[1][:, :, 38:], atol=1e-6)


def test_bad_row_choices_are_refused_in_one_line():
    model = _llama()
    with pytest.raises(ValueError, match="at least 1"):
        attach(model, layers="all", rows=0).__enter__()
    with pytest.raises(TypeError, match="number of last rows"):
        attach(model, layers="all", rows="last").__enter__()
    with pytest.raises(ValueError, match="no step"):
        attach(model, layers="all", rows=slice(0, 10, 2)).__enter__()
    with pytest.raises(ValueError, match="one or the other"):
        attach(model, statistics=True, rows=3).__enter__()
    with attach(model, layers="all", rows=[0, 60]) as seen, torch.no_grad():
        with pytest.raises(ValueError, match="position 60 is outside this call's 48 query rows"):
            model(IDS)
    with attach(model, layers="all", rows=slice(50, 60)), torch.no_grad():
        with pytest.raises(ValueError, match="holds no query row of this call, which has 48"):
            model(IDS)
    assert len(seen.attentions) == 0  # nothing kept from the refused call


def test_the_last_rows_of_a_decoding_step_are_its_one_row():
    assert query_rows.resolve_rows(16, 1) == [0]
    assert query_rows.resolve_rows(3, 10) == [7, 8, 9]
    assert query_rows.resolve_rows([-2], 10) == [8]
    assert query_rows.resolve_rows(slice(-3, None), 10) == [7, 8, 9]
    assert query_rows.resolve_rows(query_rows.check_rows(range(0, 10, 4)), 10) == [0, 4, 8]  # its step kept
    with pytest.raises(ValueError, match="position 12 is outside"):
        query_rows.resolve_rows(query_rows.check_rows(range(8, 14, 4)), 10)
