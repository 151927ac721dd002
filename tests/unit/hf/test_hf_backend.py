"""attnlab as transformers' attention backend: statistics, gradients, head masks, generation,
restoring the model, refusals — against transformers' eager implementation and attnlab's own
models of the same weights. The 25-architecture parity suite is tests/parity/test_hf_backend_parity.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

import attnlab  # noqa: E402
import attnlab.hf as hf  # noqa: E402
from attnlab.attention import exact as _kernel  # noqa: E402
from attnlab.hf import backend  # noqa: E402
from attnlab.inspect.compute import routing  # noqa: E402
from attnlab.inspect import HeadStatistics, attribute_tokens, capture_attention, mask_heads  # noqa: E402
from attnlab.inspect.compute.causal_statistics import CausalStatistics  # noqa: E402


def _llama(layers: int = 3) -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
    )
    return transformers.LlamaForCausalLM(config).eval()


def _bert_classifier(initializer_range: float = 0.02) -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_labels=3, max_position_embeddings=64, initializer_range=initializer_range,
    )
    return transformers.BertForSequenceClassification(config).eval()


def _left_padded() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, 100, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    return ids, mask


def _eager(model: nn.Module, **inputs):
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(**inputs, output_attentions=True)
    finally:
        model.set_attn_implementation("sdpa")


@pytest.mark.parametrize("block_cells", [None, 40])  # whole maps, and blocks of one or two query rows
def test_statistics_mode_equals_the_statistics_of_eager_weights(monkeypatch, block_cells):
    model = _llama()
    ids, mask = _left_padded()
    if block_cells is not None:
        monkeypatch.setattr(routing, "_STATISTICS_BLOCK_CELLS", block_cells)
    with torch.no_grad(), hf.attach(model, statistics=True, token_groups={"first": [int(ids[0, 0])]}) as seen:
        model(input_ids=ids, attention_mask=mask)
    assert seen.attentions.keys() == (), "statistics mode keeps no map"
    eager = _eager(model, input_ids=ids, attention_mask=mask)
    expected, causal = HeadStatistics(token_groups={"first": [int(ids[0, 0])]}), CausalStatistics()
    real = mask.bool()
    for index, weights in enumerate(eager.attentions):
        expected.update(f"layer_{index + 1}", weights, real, real, input_ids=ids)
        causal.update(f"layer_{index + 1}", weights, real)
    got, want = seen.statistics(), expected.means()
    for layer in want:
        for name, values in want[layer].items():
            assert got[layer][name] == pytest.approx(values, abs=1e-5), (layer, name)
        assert got[layer]["sink_mass"] == pytest.approx(causal.means()["sink_mass"][layer], abs=1e-6)
    assert seen.row_counts() == expected.row_counts()


def test_chosen_layers_and_heads_only_and_outputs_equal_sdpa():
    model = _llama()
    ids, mask = _left_padded()
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask).logits
        with hf.attach(model, layers=[2], heads=[1, 3]) as seen:
            logits = model(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(logits, reference, atol=1e-6)
    assert list(seen.attentions.keys()) == ["layer_2"]
    eager = _eager(model, input_ids=ids, attention_mask=mask).attentions[1][:, [1, 3]]
    got = seen.attentions["layer_2"]
    assert got.shape == eager.shape
    rows = mask.bool()[:, None, :, None]  # left padding: padded query rows have no key
    assert torch.allclose(torch.where(rows, got, 0.0), torch.where(rows, eager, 0.0), atol=1e-6)


def test_weights_carry_gradients_when_asked():
    model = _llama(layers=2)
    ids, mask = _left_padded()
    with hf.attach(model, layers="all", grad=True) as seen:
        logits = model(input_ids=ids, attention_mask=mask).logits
    weights = seen.attentions["layer_1"]
    (gradient,) = torch.autograd.grad(logits[0, -1, 5], weights)
    assert gradient.abs().sum() > 0
    with hf.attach(model, layers="all") as seen:
        model(input_ids=ids, attention_mask=mask)
    assert not seen.attentions["layer_1"].requires_grad


def test_model_is_left_as_it_was_even_when_the_forward_fails():
    model = _llama(layers=2)
    before = model.config._attn_implementation
    with pytest.raises(RuntimeError, match="boom"):
        with hf.attach(model, layers=[1]):
            raise RuntimeError("boom")
    assert model.config._attn_implementation == before
    assert backend.route_of(model.model.layers[0].self_attn) is None
    with pytest.raises(ValueError, match="no attention layer 'layer_9'"):
        with hf.attach(model, layers=["layer_9"]):
            pass
    assert model.config._attn_implementation == before


def test_head_mask_equals_attnlabs_own_llama_of_the_same_weights(tmp_path):
    model = _llama(layers=2)
    model.save_pretrained(tmp_path)
    ours = attnlab.load(tmp_path).model.eval()
    ids = torch.randint(1, 100, (1, 7))
    with torch.no_grad():
        with mask_heads(ours, {"layer_2": [1]}):
            expected = ours(ids).logits
        with hf.attach(model, head_mask={"layer_2": [1]}):
            got = model(input_ids=ids).logits
        with hf.attach(model), mask_heads(model, {"layer_2": [1]}):  # attnlab's mask_heads on served modules
            also = model(input_ids=ids).logits
        plain = model(input_ids=ids).logits
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(also, expected, atol=1e-5)
    assert not torch.allclose(plain, expected, atol=1e-3), "the masked head must matter"


def test_capture_attention_on_served_modules_equals_attnlabs_own_llama(tmp_path):
    model = _llama(layers=2)
    model.save_pretrained(tmp_path)
    ours = attnlab.load(tmp_path).model.eval()
    ids = torch.randint(1, 100, (1, 7))
    with torch.no_grad(), capture_attention(ours) as expected:
        ours(ids)
    with torch.no_grad(), hf.attach(model), capture_attention(model) as got:
        model(input_ids=ids)
    for name in expected.attentions:
        assert torch.allclose(got.attentions[name], expected.attentions[name], atol=1e-6)


def test_explain_methods_equal_attnlabs_own_bert_of_the_same_weights(tmp_path):
    model = _bert_classifier()
    model.save_pretrained(tmp_path)
    ours = attnlab.load(tmp_path).model.eval()
    ids = torch.randint(1, 100, (1, 6))
    methods = ["raw", "rollout", "flow", "grad-attention", "integrated-gradients"]
    got = hf.explain_tokens(model, ids, methods, steps=16)
    expected = attribute_tokens(ours, ids, methods, steps=16)
    for method in methods:
        assert torch.allclose(got.scores[method], expected.scores[method], atol=1e-5), method
    assert torch.equal(got.target, expected.target)
    with pytest.raises(ValueError, match="relevance"):
        hf.explain_tokens(model, ids, ["relevance"])


def test_generate_gives_every_steps_weights_equal_to_eager():
    model = _llama(layers=2)
    ids, mask = _left_padded()
    options = dict(max_new_tokens=3, do_sample=False, output_attentions=True, return_dict_in_generate=True,
                   pad_token_id=0)
    with torch.no_grad(), hf.attach(model):
        ours = model.generate(input_ids=ids, attention_mask=mask, **options)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model.generate(input_ids=ids, attention_mask=mask, **options)
    model.set_attn_implementation("sdpa")
    assert torch.equal(ours.sequences, eager.sequences)
    assert len(ours.attentions) == 3
    for step_ours, step_eager in zip(ours.attentions, eager.attentions):
        for got, want in zip(step_ours, step_eager):
            real = torch.isfinite(want).all(-1, keepdim=True) & (want.sum(-1, keepdim=True) > 0)
            rows = real & ~(want.std(-1, keepdim=True) == 0)  # eager spreads key-less rows uniformly
            assert torch.allclose(torch.where(rows, got, 0.0), torch.where(rows, want, 0.0), atol=1e-5)


class _HandWrittenAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(4, 4)

    def forward(self, x):
        return x


def test_refusals_name_the_module_and_the_keyword():
    model = _llama(layers=1)
    model.extra = _HandWrittenAttention()
    with pytest.raises(ValueError, match=r"extra \(_HandWrittenAttention\) computes attention without"):
        with hf.attach(model):
            pass
    del model.extra
    module = model.model.layers[0].self_attn
    query = torch.randn(1, 4, 3, 8)
    key = value = torch.randn(1, 2, 3, 8)
    with pytest.raises(hf.UnsupportedAttention, match="LlamaAttention passed 'rope_deltas'"):
        hf.attnlab_attention_forward(module, query, key, value, None, rope_deltas=torch.zeros(1))
    with pytest.raises(TypeError, match="transformers model"):
        with hf.attach(nn.Linear(2, 2)):
            pass


def test_open_transformers_and_inspect_command_on_an_architecture_attnlab_does_not_reimplement(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from attnlab.cli import main

    config = transformers.Qwen3Config(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )
    transformers.Qwen3ForCausalLM(config).save_pretrained(tmp_path / "qwen3")
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 40)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "qwen3" / "tokenizer.json"))
    assert main(["inspect", "--model", str(tmp_path / "qwen3"), "--text", "w1 w2 w3 w4",
                 "--out", str(tmp_path / "out"), "--format", "png"]) == 0
    assert (tmp_path / "out" / "report.html").is_file() and (tmp_path / "out" / "layer_2.png").is_file()
    assert main(["analyze", "--model", str(tmp_path / "qwen3"), "--data", str(_texts(tmp_path)),
                 "--out", str(tmp_path / "analysis"), "--no-progress"]) == 0
    import json

    statistics = json.loads((tmp_path / "analysis" / "statistics.json").read_text())
    assert statistics["layers"] == ["layer_1", "layer_2"] and "sink_mass" in statistics["statistics"]

    # explain on a causal model reads the last token's row (row 0 sees only itself: [1, 0, 0, 0])
    assert main(["explain", "--model", str(tmp_path / "qwen3"), "--text", "w1 w2 w3 w4", "--method", "raw",
                 "--out", str(tmp_path / "explained")]) == 0
    raw = json.loads((tmp_path / "explained" / "explanation.json").read_text())["scores"]["raw"]
    model = attnlab.hf.opening.open_transformers(tmp_path / "qwen3")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        last_layer = model(ids, output_attentions=True).attentions[-1]  # exact weights, asked for
    assert raw == pytest.approx(last_layer[0, :, -1].mean(0).tolist(), abs=1e-5)
    assert main(["generate", "--model", str(tmp_path / "qwen3"), "--prompt", "w1 w2 w3", "--max-new-tokens", "2",
                 "--report", str(tmp_path / "generated")]) == 0
    assert (tmp_path / "generated" / "generation.html").is_file()
    assert main(["compare", "--model", str(tmp_path / "qwen3"), "--model", str(tmp_path / "qwen3"), "--data",
                 str(_texts(tmp_path)), "--out", str(tmp_path / "compared")]) == 0


def _texts(tmp_path):
    path = tmp_path / "texts.csv"
    path.write_text("text\nw1 w2 w3 w4\nw5 w6 w7\nw8 w9 w10 w11 w12\n", encoding="utf-8")
    return path


def test_head_patching_equals_attnlabs_own_bert_of_the_same_weights(tmp_path):
    from attnlab.inspect import head_patching_sweep, patch_heads

    model = _bert_classifier(initializer_range=0.3)  # weights large enough for heads to move the logits
    model.save_pretrained(tmp_path)
    ours = attnlab.load(tmp_path).model.eval()
    source, target = torch.randint(1, 100, (2, 6)), torch.randint(1, 100, (2, 6))
    got = hf.patch_heads(model, source, target, {"layer_2": [0, 3]}, label=1)
    expected = patch_heads(ours, source, target, {"layer_2": [0, 3]}, label=1)
    for field in ("clean", "source", "patched"):
        assert torch.allclose(getattr(got, field), getattr(expected, field), atol=1e-5), field
    assert got.change.abs().max() > 1e-2, "the patched heads must matter"
    sweep = hf.head_patching_sweep(model, source, target, label=1)
    assert torch.allclose(sweep, head_patching_sweep(ours, source, target, label=1), atol=1e-5)
    with pytest.raises(ValueError, match="one shape"):
        hf.patch_heads(model, source, target[:, :4], {"layer_1": [0]})
    with pytest.raises(ValueError, match="layer_2 has 4 heads"):
        hf.patch_heads(model, source, target, {"layer_2": [4]})


def test_head_patching_reads_a_language_models_next_token_logit():
    model = _llama(layers=2)
    source, target = torch.randint(1, 100, (1, 6)), torch.randint(1, 100, (1, 6))
    with torch.no_grad():
        clean = model(input_ids=target).logits[:, -1]
        source_logits = model(input_ids=source).logits[:, -1]
    result = hf.patch_heads(model, source, target, {"layer_1": [0, 1, 2, 3], "layer_2": [0, 1, 2, 3]}, label=7)
    assert torch.allclose(result.clean, clean[:, 7], atol=1e-6)
    # every head of every layer patched: the target run becomes the source run, except
    # for what the residual stream carries around the attention
    assert torch.allclose(result.source, source_logits[:, 7], atol=1e-6)
    assert result.label == 7 and not torch.allclose(result.patched, result.clean)


def test_generate_gives_attnlabs_generation_output_equal_to_a_full_eager_pass():
    model = _llama(layers=2)
    ids, mask = _left_padded()
    generated = hf.generate(model, ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert generated.sequences.shape == (2, 12) and generated.prompt_length == 9
    assert len(generated.attentions) == 4  # the prompt's pass and one row per generated token
    maps = generated.attention_maps()  # [B, H, N, N] per layer
    real = generated.attention_mask.long()
    positions = (real.cumsum(-1) - 1).clamp_min(0)  # generate numbers a left-padded row from its first real token
    full = _eager(model, input_ids=generated.sequences, attention_mask=real, position_ids=positions)
    keys = generated.attention_mask[:, None, :, None]  # rows of real queries
    for got, want in zip(maps, full.attentions):
        assert torch.allclose(torch.where(keys, got, 0.0), torch.where(keys, want, 0.0), atol=1e-5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        hf.generate(model, ids, max_new_tokens=0)


@pytest.mark.parametrize("softmax", ["native", "torch"])
def test_a_long_causal_map_in_blocks_of_rows_equals_eager(monkeypatch, softmax):
    # Past 64 rows an unpadded causal map is computed in blocks of rows, each against the
    # keys up to its last row: weights, outputs, gradients and statistics as eager's, with
    # the native in-place softmax and with torch's ops.
    if softmax == "torch":
        monkeypatch.setattr(_kernel, "_in_place_causal_softmax", lambda: None)
    elif _kernel._in_place_causal_softmax() is None:
        pytest.skip("the native kernel cannot be built here")
    model = _llama(layers=2)
    ids = torch.randint(1, 100, (2, 150))
    eager = _eager(model, input_ids=ids)
    with torch.no_grad(), hf.attach(model, layers="all") as seen:
        logits = model(input_ids=ids).logits
    for name, want in zip(seen.attentions.keys(), eager.attentions):
        assert torch.allclose(seen.attentions[name], want, atol=1e-6), name
    assert torch.allclose(logits, eager.logits, atol=1e-5)
    with hf.attach(model, layers="all", grad=True) as seen:  # weights in the graph: one block
        logits = model(input_ids=ids).logits
    assert torch.allclose(seen.attentions["layer_2"], eager.attentions[1], atol=1e-6)
    (gradient,) = torch.autograd.grad(logits[0, -1, 3], seen.attentions["layer_1"])
    assert gradient[:, :, :, 100:].abs().sum() > 0
    with torch.no_grad(), hf.attach(model, statistics=True) as seen:
        model(input_ids=ids)
    expected = HeadStatistics()
    real = torch.ones(2, 150, dtype=torch.bool)
    for index, weights in enumerate(eager.attentions):
        expected.update(f"layer_{index + 1}", weights, real, real)
    for layer, values in expected.means().items():
        assert seen.statistics()[layer]["entropy"] == pytest.approx(values["entropy"], abs=1e-5)


def test_a_directory_transformers_cannot_open_gets_one_line_and_nothing_written(tmp_path, capsys):
    # Regression: an unknown model_type printed transformers' multi-line advice, and missing
    # weights ended in an OSError traceback.
    import shutil

    from tokenizers import Tokenizer, models

    from attnlab.cli import main

    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text('{"model_type": "nonexistent_arch"}')
    Tokenizer(models.WordLevel({"[UNK]": 0, "w1": 1}, unk_token="[UNK]")).save(str(unknown / "tokenizer.json"))
    config = transformers.Qwen3Config(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    weightless = tmp_path / "weightless"
    transformers.Qwen3ForCausalLM(config).save_pretrained(weightless)
    (weightless / "model.safetensors").unlink()
    shutil.copy(unknown / "tokenizer.json", weightless / "tokenizer.json")
    for directory, message in ((unknown, "model_type 'nonexistent_arch' is neither one attnlab re-implements"),
                               (weightless, "no file named model.safetensors")):
        capsys.readouterr()
        try:
            code = main(["inspect", "--model", str(directory), "--text", "w1", "--out", str(tmp_path / "out")])
        except SystemExit as stop:
            code = stop.code
        error = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(error) == 1 and message in error[0], error
        assert not (tmp_path / "out").exists()


def test_raw_rollout_and_flow_on_a_served_llama_equal_attnlabs_own_llama(tmp_path):
    # The explain methods that read weights, on a causal model: both explain the last token.
    from attnlab.hf.opening import TransformersModel

    model = _llama(layers=2)
    model.save_pretrained(tmp_path)
    ours = attnlab.load(tmp_path).model.eval()
    served = TransformersModel(_llama(layers=2), name="llama")
    served.model.load_state_dict(model.state_dict())
    ids = torch.randint(1, 100, (1, 7))
    methods = ["raw", "rollout", "flow"]
    got = attribute_tokens(served, ids, methods)
    expected = attribute_tokens(ours, ids, methods)
    for method in methods:
        assert torch.allclose(got.scores[method], expected.scores[method], atol=1e-5), method
    assert got.scores["raw"][0, 0] < 0.99  # not row 0's [1, 0, 0, ...]


def _word_tokenizer(directory, size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, **{f"w{i}": i for i in range(1, size)}}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))


def _gemma3_sliding(window: int = 8) -> nn.Module:
    config = transformers.Gemma3TextConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=window, query_pre_attn_scalar=8,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=64, pad_token_id=0,
    )
    return transformers.Gemma3ForCausalLM(config).eval()


def test_generate_puts_a_sliding_windows_weights_at_their_key_positions(tmp_path):
    """Gemma 3's sliding layer caches its last 8 keys only: its weights of each new token came
    back over those 8, without their positions (and attention_maps raised). They belong at
    their key positions, zeros outside the window, as one eager pass over the sequence."""
    from attnlab.cli import main

    torch.manual_seed(0)
    model = _gemma3_sliding(window=8)
    ids = torch.randint(3, 40, (2, 17))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    generated = hf.generate(model, ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert generated.generated_attention(0)["layer_1"].shape == (2, 4, 18)  # every position up to itself
    first = generated.generated_attention(0)["layer_1"]
    assert (first[:, :, :10] == 0).all() and (first[0, :, 10:].sum(-1) - 1).abs().max() < 1e-5  # window 8
    maps = generated.attention_maps()
    real = generated.attention_mask.long()
    positions = (real.cumsum(-1) - 1).clamp_min(0)
    full = _eager(model, input_ids=generated.sequences, attention_mask=real, position_ids=positions)
    rows = generated.attention_mask[:, None, :, None]
    for got, want in zip(maps, full.attentions):
        assert torch.allclose(torch.where(rows, got, 0.0), torch.where(rows, want, 0.0), atol=1e-5)

    model.save_pretrained(tmp_path / "gemma3")
    _word_tokenizer(tmp_path / "gemma3", 40)
    prompt = " ".join(f"w{i}" for i in range(1, 14))
    assert main(["generate", "--model", str(tmp_path / "gemma3"), "--prompt", prompt, "--max-new-tokens", "4",
                 "--report", str(tmp_path / "generated")]) == 0
    assert (tmp_path / "generated" / "generation.html").is_file()


def test_an_encoder_decoders_statistics_read_the_text_as_its_own_target():
    """T5 could not be analysed (no decoder input: transformers' error); BART could, on a
    decoder input nobody named. Both now get the text shifted right after the start token,
    and say so: the decoder's and cross-attention's statistics equal eager's on that input."""
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        pad_token_id=0, decoder_start_token_id=0)).eval()
    ids = torch.randint(1, 100, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    batches = [{"input_ids": ids, "attention_mask": mask}]
    from attnlab.hf.analysis import analyze_transformers

    statistics = analyze_transformers(t5, batches)
    assert statistics.settings["decoder_input"].startswith("each text itself, shifted right")
    shifted = torch.cat([torch.zeros_like(ids[:, :1]), ids[:, :-1]], 1)
    shifted_mask = torch.cat([torch.ones_like(mask[:, :1]), mask[:, :-1]], 1)
    eager = _eager(t5, input_ids=ids, attention_mask=mask, decoder_input_ids=shifted,
                   decoder_attention_mask=shifted_mask)
    expected = HeadStatistics()
    for index, weights in enumerate(eager.decoder_attentions):
        expected.update(f"decoder.layer_{index + 1}", weights, shifted_mask.bool(), shifted_mask.bool())
    for index, weights in enumerate(eager.cross_attentions):
        expected.update(f"cross.layer_{index + 1}", weights, shifted_mask.bool(), mask.bool())
    for layer, values in expected.means().items():
        assert statistics.statistics["entropy"][layer] == pytest.approx(values["entropy"], abs=1e-5), layer


def test_attention_called_in_chunks_is_served_block_diagonal(monkeypatch):
    """Qwen2-VL's vision tower calls the attention function once per image inside one run of
    each attention module. attnlab lays the chunks' weights block-diagonally (each image over
    its own patches): equal to eager's weights of each call, caught as they are computed; a head
    mask on a chunked layer equals the head's output zeroed in every chunk."""
    from transformers.models.qwen2_vl import modeling_qwen2_vl

    from attnlab.hf.census_models import _image_forms, shrink

    config = shrink(transformers.Qwen2VLConfig())
    torch.manual_seed(0)
    model = transformers.Qwen2VLModel(config).eval()
    form = _image_forms(config.vision_config, torch.zeros(2, 3, 32, 32))[-1]  # two images of 4 x 4 patches
    caught = []
    eager = modeling_qwen2_vl.eager_attention_forward

    def catching(module, *args, **kwargs):
        output, weights = eager(module, *args, **kwargs)
        caught.append((module, weights))
        return output, weights

    monkeypatch.setattr(modeling_qwen2_vl, "eager_attention_forward", catching)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        want = model.get_image_features(**form).pooler_output
    sites = [site for site in hf.attention_sites(model) if site.name.startswith("vision.")]
    with torch.no_grad(), hf.attach(model, layers=[site.name for site in sites]) as seen:
        got = model.get_image_features(**form).pooler_output
    for first, second in zip(got, want):
        assert torch.allclose(first, second, atol=1e-5)
    for site in sites:
        chunks = [weights for module, weights in caught if module is site.module]
        assert len(chunks) == 2 and chunks[0].shape[-1] == 16
        recorded = seen.attentions[site.name]
        assert recorded.shape == (1, site.heads, 32, 32)
        assert torch.allclose(recorded, _block_diagonal_heads(chunks), atol=1e-6)
    # a head switched off in the first vision layer: zero in every chunk
    head, site = 1, sites[0]

    def zeroed_head(module, *args, **kwargs):
        output, weights = eager(module, *args, **kwargs)  # [1, T, H, D]
        if module is site.module:
            output = output.clone()
            output[:, :, head] = 0
        return output, weights

    monkeypatch.setattr(modeling_qwen2_vl, "eager_attention_forward", zeroed_head)
    with torch.no_grad():
        want = model.get_image_features(**form).pooler_output
    with torch.no_grad(), hf.attach(model, head_mask={site.name: [head]}):
        got = model.get_image_features(**form).pooler_output
    for first, second in zip(got, want):
        assert torch.allclose(first, second, atol=1e-5)


def _block_diagonal_heads(chunks):
    heads = chunks[0].shape[1]
    return torch.stack([torch.block_diag(*[c[0, h] for c in chunks]) for h in range(heads)])[None]
