"""One inspection function for both doors: attnlab's own modules are served by the function
transformers models are served by (recording, statistics block by block, head outputs)."""

from __future__ import annotations

import pytest
import torch

from attnlab import TransformerEncoder
from attnlab.inspect import capture_attention, inspectable
from attnlab.inspect.compute import routing
from attnlab.inspect.compute.statistics import HeadStatistics
from attnlab.layers.decoder_config import DecoderConfig
from attnlab.models.classifier import EncoderClassifier
from attnlab.models.decoder import DecoderForCausalLM

IDS = torch.tensor([[2, 5, 6, 7, 8, 3, 0, 0], [2, 9, 10, 11, 12, 13, 14, 3]])
MASK = IDS != 0


def _classifier() -> EncoderClassifier:
    torch.manual_seed(0)
    encoder = TransformerEncoder(30, d_model=16, num_layers=3, num_heads=4, d_ff=32, pad_id=0)
    return EncoderClassifier(encoder, 2).eval()


def _decoder() -> DecoderForCausalLM:
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=30, d_model=16, num_layers=2, num_heads=4, d_ff=32, num_kv_heads=2, eos_id=3)
    return DecoderForCausalLM(config).eval()


def _blocks(monkeypatch):
    """Every block of query rows the statistics mode reduces: (layer, first row, rows, all rows)."""
    seen = []
    reduce = routing.Route.statistics_block

    def spy(route, weights, start, rows, keys):
        seen.append((route.site.name, start, weights.shape[-2], rows))
        return reduce(route, weights, start, rows, keys)

    monkeypatch.setattr(routing.Route, "statistics_block", spy)
    return seen


def _whole_map_statistics(maps, mask):
    expected = HeadStatistics()
    for name, weights in maps.items():
        expected.update(name, weights, mask, mask)
    return expected.means()


@pytest.mark.parametrize("cells", [None, 40])  # whole calls, and blocks of one or two query rows
def test_own_statistics_are_reduced_block_by_block_and_equal_those_of_the_whole_maps(monkeypatch, cells):
    model = _classifier()
    with torch.no_grad(), capture_attention(model) as captured:
        model(IDS, mask=MASK)
    want = _whole_map_statistics(captured.attentions, MASK)
    if cells is not None:
        monkeypatch.setattr(routing, "_STATISTICS_BLOCK_CELLS", cells)
    blocks = _blocks(monkeypatch)
    with torch.no_grad(), inspectable(model).statistics() as recorder:
        model(IDS, mask=MASK)
    got = recorder.means()
    for layer in want:
        for name, values in want[layer].items():
            assert got[layer][name] == pytest.approx(values, abs=1e-6, nan_ok=True), (layer, name)
    assert {name for name, *_ in blocks} == {"layer_1", "layer_2", "layer_3"}
    if cells is None:
        assert all(start == 0 and t == rows == 8 for _, start, t, rows in blocks)
    else:  # 40 cells of [B=2, H=4, t, S=8] weights: one query row at a time, never a layer's map
        assert all(t == 1 for _, _, t, _ in blocks) and len(blocks) == 3 * 8


def test_own_decoder_statistics_block_by_block_equal_those_of_the_whole_maps(monkeypatch):
    model = _decoder()
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 9, 4], [1, 5, 6, 7, 8, 9, 10, 11]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8]).bool()
    with torch.no_grad(), capture_attention(model) as captured:
        model(ids, mask)
    want = _whole_map_statistics(captured.attentions, mask)
    monkeypatch.setattr(routing, "_STATISTICS_BLOCK_CELLS", 128)  # [B=2, H=4, t=2, S=8]
    blocks = _blocks(monkeypatch)
    with torch.no_grad(), inspectable(model).statistics() as recorder:
        model(ids, mask)
    got = recorder.means()
    for layer, values in want.items():
        for name, per_head in values.items():
            assert got[layer][name] == pytest.approx(per_head, abs=1e-6, nan_ok=True), (layer, name)
    assert max(t for _, _, t, _ in blocks) == 2 and len(blocks) == 2 * 4


def test_capture_records_in_the_inspecting_function_and_equals_the_models_own_weights():
    model = _classifier()
    returned = []
    record = routing.Route.returned_weights

    def spy(route, weights, asked):
        returned.append(route.site.name)
        return record(route, weights, asked)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(routing.Route, "returned_weights", spy)
        with torch.no_grad(), capture_attention(model) as captured:
            model(IDS, mask=MASK)
    assert returned == ["layer_1", "layer_2", "layer_3"]
    expected = model.encoder(IDS, mask=MASK, output_attentions=True).attentions
    for name in expected.keys():
        assert torch.equal(captured.attentions[name], expected[name])
    assert all(layer.self_attn.attn_implementation == "sdpa" for layer in model.encoder.layers)


def test_own_head_outputs_are_each_heads_output_before_the_output_projection():
    model = _decoder()
    ids = torch.tensor([[1, 5, 6, 7]])
    projection = model.layers[1].self_attn.o_proj
    seen = {}
    handle = projection.register_forward_pre_hook(lambda module, args: seen.setdefault("x", args[0].clone()))
    try:
        with torch.no_grad(), inspectable(model).head_outputs(["layer_2"]) as recorded:
            model(ids)
    finally:
        handle.remove()
    assert recorded["layer_2"].shape == (1, 4, 4, 4)  # [B, T, H, D]
    assert torch.equal(recorded["layer_2"].reshape(1, 4, 16), seen["x"])
    patched = recorded["layer_2"].clone()
    patched[..., 0, :] = 0.0
    chosen = torch.tensor([True, False, False, False])
    with torch.no_grad(), inspectable(model).head_outputs([], replace={"layer_2": (chosen, patched)}):
        handle = projection.register_forward_pre_hook(lambda module, args: seen.__setitem__("y", args[0].clone()))
        try:
            model(ids)
        finally:
            handle.remove()
    assert seen["y"].reshape(1, 4, 4, 4)[..., 0, :].abs().max() == 0
    assert torch.equal(seen["y"].reshape(1, 4, 4, 4)[..., 1:, :], recorded["layer_2"][..., 1:, :])


def test_a_module_inspected_twice_at_once_is_refused_in_one_line():
    model = _classifier()
    view = inspectable(model)
    with view.statistics():
        with pytest.raises(RuntimeError, match=r"already being inspected \(at encoder.layers.0.self_attn\)"):
            with view.statistics():
                pass
