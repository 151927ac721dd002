"""attnlab's native decoding step (``_native/decode_step.cpp``): a float64 forward's logits and
weights at every step, the module path's tokens through ``generate``, and the models it
leaves to the module path."""

from __future__ import annotations

import os

import pytest
import torch

from attnlab import _native
from attnlab.layers.decoder_config import DecoderConfig
from attnlab.models.decoder import DecoderForCausalLM, generation
from attnlab.models.decoder.native_decoding import NativeDecoding, unserved_reason

needs_kernel = pytest.mark.skipif(_native.unavailable_reason("decode_step") is not None,
                                  reason="the native kernel cannot be built here (no compiler or ninja)")

CONFIGS = {
    "grouped-query": dict(num_heads=4, num_kv_heads=2),
    "multi-head, biases, untied": dict(num_heads=4, qkv_bias=True, out_bias=True, ffn_bias=True,
                                       tie_embeddings=False),
    "multi-query, sliding window": dict(num_heads=4, num_kv_heads=1, sliding_window=4),
    "learned positions, layer scales, head dim 12": dict(num_heads=3, head_dim=12, position="learned",
                                                         scale_by_layer=True),
    "GPT-2: LayerNorm, plain GELU (tanh) net, biases": dict(norm="layer", feed_forward="plain",
                                                            activation="gelu_tanh", position="learned",
                                                            qkv_bias=True, out_bias=True, ffn_bias=True),
    "gated GELU": dict(activation="gelu", num_kv_heads=2),
    # seven query heads per key/value head (blocks of 4 and 3), a head dim past a vector's width
    "seven heads per group, head dim 12, window": dict(num_heads=7, num_kv_heads=1, head_dim=12,
                                                        sliding_window=5),
    "plain ReLU": dict(feed_forward="plain", activation="relu"),
}


def _model(seed: int = 0, **options) -> DecoderForCausalLM:
    torch.manual_seed(seed)
    options = {"num_heads": 4, **options}
    config = DecoderConfig(vocab_size=97, d_model=32, num_layers=3, d_ff=72, max_len=64, norm_eps=1e-5,
                           **options)
    model = DecoderForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(1.0 if "norm" in name else 0.0, 0.2 if "norm" in name else 0.3)
    return model


def _prompt(batch: int = 3, length: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 97, (batch, length), generator=torch.Generator().manual_seed(1))
    keep = torch.ones(batch, length, dtype=torch.bool)
    if batch > 1:  # left padding of different lengths
        keep[1, :2] = False
        keep[-1, :1] = False
    return ids, keep


def _error(ours: torch.Tensor, exact: torch.Tensor) -> float:
    return float((ours.double() - exact).abs().max())


@needs_kernel
@pytest.mark.parametrize("options", CONFIGS.values(), ids=CONFIGS.keys())
def test_each_step_gives_a_float64_forward_s_logits_and_weights(options):
    """Steps after a cached prompt pass, against the whole sequence through the float64 model:
    as close to it as the float32 module path is (float32 rounding in another order)."""
    model = _model(**options)
    reference = _model(**options).double()
    assert unserved_reason(model, 3) is None
    ids, keep = _prompt()
    new = torch.randint(0, 97, (3, 7), generator=torch.Generator().manual_seed(2))
    cache = model.new_cache(capacity=ids.shape[1] + new.shape[1])
    with torch.no_grad():
        model(ids, keep, past_key_values=cache, use_cache=True)
        steps = NativeDecoding(model, cache, keep, need_weights=True)
        for step in range(new.shape[1]):
            logits, weights = steps(new[:, step])
            sequence = torch.cat((ids, new[:, : step + 1]), dim=1)
            mask = torch.cat((keep, torch.ones(3, step + 1, dtype=torch.bool)), dim=1)
            exact = reference(sequence, mask, output_attentions=True)
            modules = model(sequence, mask, output_attentions=True)  # float32, no cache
            assert logits.shape == (3, 1, 97) and logits.dtype == torch.float32
            assert (_error(logits, exact.logits[:, -1:])
                    <= 4 * _error(modules.logits[:, -1:], exact.logits[:, -1:]) + 1e-6)
            assert len(weights) == 3
            for ours, theirs, module_path in zip(weights, exact.attentions, modules.attentions):
                assert ours.shape == (3, model.config.num_heads, 1, sequence.shape[1])
                assert (_error(ours, theirs[:, :, -1:])
                        <= 4 * _error(module_path[:, :, -1:], theirs[:, :, -1:]) + 1e-7)
                assert (ours[~mask[:, None, None].expand_as(ours)] == 0).all()  # padding: exactly 0


@needs_kernel
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("sample", [False, True])
@pytest.mark.parametrize("weights", [False, True])
def test_generate_takes_the_native_steps_and_gives_the_module_path_s_tokens(monkeypatch, batch, sample,
                                                                             weights):
    model = _model(**CONFIGS["grouped-query"])
    ids, keep = _prompt(batch)
    options = dict(max_new_tokens=9, eos_token_id=-1, output_attentions=weights, do_sample=sample, seed=5)
    calls = []
    real = NativeDecoding.__call__
    monkeypatch.setattr(NativeDecoding, "__call__",
                        lambda self, tokens: calls.append(1) or real(self, tokens))
    native = model.generate(ids, keep, **options)
    steps = 9 if weights else 8  # with weights the last token's step runs too, to record its row
    assert len(calls) == steps
    monkeypatch.setattr(generation, "unserved_reason", lambda model, batch: "the module path, for comparison")
    modules = model.generate(ids, keep, **options)
    assert len(calls) == steps
    assert native.sequences.tolist() == modules.sequences.tolist()
    for ours, theirs in zip(native.attentions or (), modules.attentions or ()):
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)  # float32 sums in another order


HOOKED = "the model has forward hooks, or a forward set on one of its modules"


def test_models_it_does_not_compute_keep_the_module_path():
    from attnlab.inspect.compute.heads import mask_heads

    served = _native.unavailable_reason("decode_step")  # None where the kernel is built, else why not
    model = _model()
    assert unserved_reason(model, 8) == served
    with mask_heads(model, torch.ones(3, 4)):
        assert unserved_reason(model, 1) == HOOKED
    assert "past the 8 rows" in unserved_reason(model, 9)
    gpt2 = _model(norm="layer", feed_forward="plain", activation="gelu_tanh", position="learned")
    assert unserved_reason(gpt2, 1) == served
    gpt2.layers[2].feed_forward.dropout1.p = 0.1
    assert unserved_reason(gpt2, 1) == served  # dropout does nothing in eval mode
    gpt2.train()
    assert unserved_reason(gpt2, 1) == "a feed-forward net has dropout, in training mode"
    gpt2.layers[2].feed_forward.dropout1.p = 0.0
    assert unserved_reason(gpt2, 1) == served
    gpt2.layers[1].self_attn.forward = lambda *args, **kwargs: None  # patched on the instance
    assert unserved_reason(gpt2, 1) == HOOKED
    del gpt2.layers[1].self_attn.forward
    gpt2.layers[0].feed_forward.activation = torch.tanh
    assert unserved_reason(gpt2, 1) == "a feed-forward net's activation is not its config's"
    assert unserved_reason(_model().bfloat16(), 1) == served  # see test_decode_step_low_precision.py
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert unserved_reason(model, 1) == "autocast is on"
    model.layers[1].feed_forward.up_proj = torch.nn.Linear(32, 72)
    assert "other types" in unserved_reason(model, 1)

    class Scaled(DecoderForCausalLM):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    assert unserved_reason(Scaled(_model().config), 1) == "Scaled overrides forward"


@needs_kernel
def test_a_model_cut_to_fewer_layers_than_its_config_generates():
    """Regression: the steps took the cache's layers (the config's count), not the model's."""
    model = _model()
    ids, keep = _prompt()
    model.layers = model.layers[:2]
    native = model.generate(ids, keep, max_new_tokens=5, eos_token_id=-1, output_attentions=True)
    assert len(native.attentions[-1]) == 2
    with torch.no_grad():
        full = model(native.sequences, native.attention_mask, output_attentions=True)
    for step_weights, whole in zip(native.attentions[-1], full.attentions):
        torch.testing.assert_close(step_weights[:, :, 0], whole[:, :, -1], rtol=0, atol=1e-5)


@needs_kernel
def test_a_head_mask_still_switches_heads_off_in_generation(monkeypatch):
    """With mask_heads on, generate keeps the modules' forward, so the masked heads stay off."""
    from attnlab.inspect.compute.heads import mask_heads

    model = _model(**CONFIGS["grouped-query"])
    ids, _ = _prompt(1)
    plain = model.generate(ids, max_new_tokens=8, eos_token_id=-1)
    monkeypatch.setattr(NativeDecoding, "__call__", lambda self, tokens: pytest.fail("the native step ran"))
    with mask_heads(model, torch.zeros(3, 4)):
        masked = model.generate(ids, max_new_tokens=8, eos_token_id=-1)
    with torch.no_grad():  # the same heads off by the modules' own head_mask, step by step
        sequence = ids
        for _ in range(8):
            x = model.embed_tokens(sequence)
            cos, sin = model.rotary(torch.arange(sequence.shape[1])[None], x.dtype)
            for layer in model.layers:
                attended, _ = layer.self_attn(layer.attn_norm(x), rotary=(cos, sin), is_causal=True,
                                              head_mask=torch.zeros(4))
                x = x + attended
                x = x + layer.feed_forward(layer.ffn_norm(x))
            token = model.lm_head(model.norm(x))[:, -1].argmax(-1)
            sequence = torch.cat((sequence, token[:, None]), dim=1)
    assert masked.sequences.tolist() == sequence.tolist()
    assert masked.sequences.tolist() != plain.sequences.tolist()


@needs_kernel
def test_the_kernel_refuses_a_cache_it_cannot_write_in_place():
    model = _model()
    cache = model.new_cache(capacity=8)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), past_key_values=cache, use_cache=True)
        keys, _ = cache.storage(0)
        cache._keys[0] = keys.transpose(1, 2).contiguous().transpose(1, 2)  # same shape, strided
        steps = NativeDecoding(model, cache, None, need_weights=False)
        with pytest.raises(RuntimeError, match="must be a contiguous float32 CPU tensor"):
            steps(torch.tensor([4]))
        cache._keys[0] = keys
        steps = NativeDecoding(model, cache, None, need_weights=False)
        weights = steps.arguments[0]
        weights[14 + 3] = torch.zeros(5)  # layer 1's query/key/value bias, of the wrong size
        with pytest.raises(RuntimeError, match=r"layer 1's weight entry 3 is \[5\], expected \[96\]"):
            steps(torch.tensor([4]))
        weights[14 + 3] = None
        weights.pop()  # the LM head's bias entry missing
        with pytest.raises(RuntimeError, match="one cache, one scale and 14 weights per layer expected"):
            steps(torch.tensor([4]))


def test_the_switch_leaves_generation_to_the_modules(run_python):
    """ATTNLAB_NATIVE=0: generate runs the modules, and says why when asked."""
    script = """
        import torch
        from attnlab.layers.decoder_config import DecoderConfig
        from attnlab.models.decoder import DecoderForCausalLM, generation
        generation.NativeDecoding = None  # generate would fail, were it to take the native steps
        torch.manual_seed(0)
        config = DecoderConfig(vocab_size=50, d_model=16, num_layers=1, num_heads=2, d_ff=32)
        out = DecoderForCausalLM(config).generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4,
                                                  eos_token_id=-1)
        print(out.sequences.shape[1], generation.unserved_reason(DecoderForCausalLM(config), 1))
    """
    assert run_python(script, ATTNLAB_NATIVE="0").strip() == "7 turned off by ATTNLAB_NATIVE=0"


@needs_kernel
@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512",
                    reason="only a CPU with AVX-512 has a second vector width to build for")
def test_the_avx2_build_gives_the_same_numbers(run_python):
    """The same source built for AVX2 (what torch dispatches to on a CPU without AVX-512)."""
    test_file = os.path.abspath(__file__)
    script = f"""
        import importlib.util, torch
        spec = importlib.util.spec_from_file_location("steps", {test_file!r})
        steps = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(steps)
        for options in steps.CONFIGS.values():
            steps.test_each_step_gives_a_float64_forward_s_logits_and_weights(options)
        from attnlab import _native
        print(_native.status("decode_step"))
    """
    stdout = run_python(script, ATEN_CPU_CAPABILITY="avx2")
    assert stdout.strip().splitlines()[-1] == "ready (AVX2)"
