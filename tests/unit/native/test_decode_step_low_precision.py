"""The native decoding step with bfloat16 and float16 weights and cache (``_native/decode_step.cpp``):
logits against a float64 forward of the same rounded weights (at least as close as the module
path, which rounds every operation to the dtype), greedy tokens equal to the module path's,
the cache written in the model's dtype, and the builds for each vector width."""

from __future__ import annotations

import os

import pytest
import torch

from attnlab._dispatch import native_unavailable_reason
from attnlab.layers.decoder_config import DecoderConfig
from attnlab.models.decoder import DecoderForCausalLM, generation
from attnlab.models.decoder.native_decoding import NativeDecoding, unserved_reason

needs_kernel = pytest.mark.skipif(native_unavailable_reason("decode_step") is not None,
                                  reason="the native kernel cannot be built here (no compiler or ninja)")

FAMILIES = {
    "llama": dict(num_kv_heads=2),
    "gpt2": dict(norm="layer", feed_forward="plain", activation="gelu_tanh", position="learned", qkv_bias=True,
                 out_bias=True, ffn_bias=True),
}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _model(family: str, dtype: torch.dtype, seed: int = 0) -> DecoderForCausalLM:
    torch.manual_seed(seed)
    config = DecoderConfig(vocab_size=97, d_model=32, num_layers=3, d_ff=72, max_len=64, norm_eps=1e-5,
                           num_heads=4, **FAMILIES[family])
    model = DecoderForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(1.0 if "norm" in name else 0.0, 0.2 if "norm" in name else 0.3)
    return model.to(dtype)


def _prompt(batch: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 97, (batch, 6), generator=torch.Generator().manual_seed(seed))
    keep = torch.ones(batch, 6, dtype=torch.bool)
    if batch > 1:  # left padding of different lengths
        keep[1, :2] = False
        keep[-1, :3] = False
    return ids, keep


def _module_path_generate(monkeypatch, model, *args, **options):
    with monkeypatch.context() as patch:
        patch.setattr(generation, "unserved_reason", lambda model, batch: "the module path, for comparison")
        return model.generate(*args, **options)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("family", FAMILIES)
def test_each_step_is_at_least_as_close_to_float64_as_the_module_path(family, dtype):
    """Steps after a cached prompt pass against the whole sequence through the float64 model
    of the same (rounded) weights: the module path rounds every result to the dtype, the native
    step only the cache, so its logits are closer; and within the dtype's tolerance."""
    model = _model(family, dtype)
    reference = _model(family, dtype).double()
    assert unserved_reason(model, 3) is None
    ids, keep = _prompt(3)
    new = torch.randint(0, 97, (3, 8), generator=torch.Generator().manual_seed(2))
    cache = model.new_cache(capacity=ids.shape[1] + new.shape[1])
    native_errors, module_errors = [], []
    with torch.no_grad():
        model(ids, keep, past_key_values=cache, use_cache=True)
        steps = NativeDecoding(model, cache, keep, need_weights=True)
        for step in range(new.shape[1]):
            logits, weights = steps(new[:, step])
            sequence = torch.cat((ids, new[:, : step + 1]), dim=1)
            mask = torch.cat((keep, torch.ones(3, step + 1, dtype=torch.bool)), dim=1)
            exact = reference(sequence, mask).logits[:, -1]  # [B, V]
            modules = model(sequence, mask).logits[:, -1]
            assert logits.shape == (3, 1, 97) and logits.dtype == torch.float32
            assert all(layer.dtype == dtype for layer in weights)  # as the prompt pass records them
            native_errors.append(float((logits[:, 0].double() - exact).abs().max()))
            module_errors.append(float((modules.double() - exact).abs().max()))
            # the dtype's tolerance: a few units of its rounding at the logits' scale
            assert native_errors[-1] <= 16 * torch.finfo(dtype).eps * float(exact.abs().max())
            assert native_errors[-1] <= 1.5 * module_errors[-1]
    assert sum(native_errors) <= sum(module_errors)
    keys, _ = cache.storage(0)
    assert keys.dtype == dtype  # the cache stays in the model's dtype


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_tokens_are_the_module_path_s(monkeypatch, dtype, batch):
    """A GPT-2-style model whose top two logits stay far apart along these 30 steps (a float64
    gap of at least 0.7): both paths must pick the same tokens."""
    model = _model("gpt2", dtype, seed=3)
    ids, keep = _prompt(batch, seed=4)
    options = dict(max_new_tokens=30, eos_token_id=-1)
    native = model.generate(ids, keep, **options)
    modules = _module_path_generate(monkeypatch, model, ids, keep, **options)
    with torch.no_grad():
        exact = model.double()(native.sequences, native.attention_mask).logits[:, 5:-1]  # [B, 30, V]
    top_two = exact.topk(2, dim=-1).values
    assert float((top_two[..., 0] - top_two[..., 1]).min()) > 0.5  # the premise: no near ties
    assert native.sequences.tolist() == modules.sequences.tolist()


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_tokens_are_float64_s_but_for_near_ties(monkeypatch, dtype, batch):
    """A Llama-style model (rotary positions, gated net), where random weights leave near ties
    along the way: every native token is the float64 forward's argmax over the same sequence,
    unless the two are within the module path's own error of each other; and where the
    float64 argmax leads by more than that, the module path picks it too."""
    model = _model("llama", dtype)
    ids, keep = _prompt(batch)
    native = model.generate(ids, keep, max_new_tokens=30, eos_token_id=-1)
    with torch.no_grad():
        modules = model(native.sequences, native.attention_mask).logits[:, 5:-1].double()  # [B, 30, V]
        exact = model.double()(native.sequences, native.attention_mask).logits[:, 5:-1]
    tolerance = (modules - exact).abs().amax(-1)  # [B, 30]: the module path's error at each step
    chosen = native.sequences[:, 6:]  # [B, 30]
    lead = exact.max(-1).values - exact.gather(-1, chosen[..., None])[..., 0]  # 0 where it is the argmax
    assert bool((lead <= 2 * tolerance).all())
    clear = exact.topk(2, dim=-1).values.diff(dim=-1)[..., 0].abs() > 2 * tolerance  # [B, 30]: far from a tie
    assert int(clear.sum()) >= 10  # the premise: enough clear steps to check
    assert (chosen[clear] == exact.argmax(-1)[clear]).all()
    assert (modules.argmax(-1)[clear] == exact.argmax(-1)[clear]).all()


def test_mixed_or_unserved_dtypes_keep_the_module_path():
    served = native_unavailable_reason("decode_step")
    model = _model("llama", torch.bfloat16)
    assert unserved_reason(model, 1) == served
    assert unserved_reason(model.half(), 1) == served
    model.layers[1].ffn_norm.float()
    assert unserved_reason(model, 1) == ("the parameters mix dtypes: embed_tokens.weight is torch.float16, "
                                         "layers.1.ffn_norm.weight torch.float32")
    assert "is torch.float64, not float32, bfloat16 or float16" in unserved_reason(model.double(), 1)


@needs_kernel
def test_a_float32_cache_under_bfloat16_weights_is_refused():
    model = _model("llama", torch.bfloat16)
    cache = model.new_cache(capacity=8)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), past_key_values=cache, use_cache=True)
        cache._keys[0] = cache._keys[0].float()
        steps = NativeDecoding(model, cache, None, need_weights=False)
        with pytest.raises(RuntimeError, match="every weight matrix and cache must be a contiguous bfloat16"):
            steps(torch.tensor([4]))


def _run_in_build(run_python, capability: str) -> str:
    test_file = os.path.abspath(__file__)
    script = f"""
        import importlib.util, torch
        spec = importlib.util.spec_from_file_location("steps", {test_file!r})
        steps = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(steps)
        for family in steps.FAMILIES:
            for dtype in steps.DTYPES.values():
                steps.test_each_step_is_at_least_as_close_to_float64_as_the_module_path(family, dtype)
        from attnlab import _dispatch
        print(_dispatch.native_status("decode_step"))
    """
    return run_python(script, ATEN_CPU_CAPABILITY=capability).strip().splitlines()[-1]


@needs_kernel
def test_the_avx2_build_serves_bfloat16_and_float16(run_python):
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("an x86 CPU with AVX2 builds for AVX2")
    assert _run_in_build(run_python, "avx2") == "ready (AVX2)"


@needs_kernel
@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512",
                    reason="this CPU has no AVX-512: the AVX-512 build cannot run here")
def test_the_avx512_build_serves_bfloat16_and_float16(run_python):
    assert _run_in_build(run_python, "avx512") == "ready (AVX512)"
