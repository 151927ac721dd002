"""Faster generation: products through MKL's packed weights (``attnlab._packed_weights``) and
compiled decoding steps (``generate(..., compile=True)``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab._packed_weights import mkl_packing_available, packed_for_rows
from attnlab._precision import Linear
from attnlab._skinny import serves_rows
from attnlab.layers.decoder_config import DecoderConfig
from attnlab.models.decoder import DecoderForCausalLM, compiled_decoding, generation

needs_mkl = pytest.mark.skipif(not mkl_packing_available(), reason="this torch build has no MKL packed GEMM")


@pytest.fixture
def packed_products(monkeypatch):
    """Counts the products that went through the packed weights."""
    import attnlab._precision as precision

    counted = {"packed": 0}
    real = precision.packed_linear

    def counting(module, x):
        out = real(module, x)
        counted["packed"] += out is not None
        return out

    monkeypatch.setattr(precision, "packed_linear", counting)
    return counted


def _layers():
    torch.manual_seed(0)
    return torch.nn.Sequential(Linear(24, 40), torch.nn.GELU(), Linear(40, 24, bias=False))


@needs_mkl
def test_packed_product_equals_the_plain_one_for_its_row_count_only(packed_products):
    model = _layers()
    x = torch.randn(4, 1, 24)
    other = torch.randn(3, 24)
    with torch.no_grad():
        expected, expected_other = model(x), model(other)
        with packed_for_rows(model, 4) as packed:
            assert packed == 2
            got = model(x)
            assert packed_products["packed"] == 2
            got_other = model(other)
            assert packed_products["packed"] == 2
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert torch.equal(got_other, expected_other)  # other row counts take the plain product
    assert all("_packed_weight" not in layer.__dict__ for layer in model)  # copies dropped on exit


@needs_mkl
def test_budget_and_gradients_keep_the_plain_product():
    model = _layers()
    with packed_for_rows(model, 2, budget=0) as packed:
        assert packed == 0
    x = torch.randn(2, 24, requires_grad=True)
    with packed_for_rows(model, 2):
        y = model(x)  # gradients on: the packed operator has no backward
        y.sum().backward()
    assert torch.equal(y, F.linear(F.gelu(F.linear(x, model[0].weight, model[0].bias)), model[2].weight))
    assert x.grad is not None


@needs_mkl
def test_packed_copies_are_dropped_when_the_block_raises():
    model = _layers()
    with pytest.raises(KeyError), packed_for_rows(model, 2):
        raise KeyError("inside")
    assert all("_packed_weight" not in layer.__dict__ for layer in model)


def _tiny_decoder():
    torch.manual_seed(0)
    return DecoderForCausalLM(DecoderConfig(vocab_size=50, d_model=16, num_layers=2, num_heads=4, d_ff=32,
                                            num_kv_heads=2)).eval()


def test_compile_and_pack_weights_do_not_combine():
    with pytest.raises(ValueError, match="pack_weights=True and compile=True"):
        _tiny_decoder().generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, compile=True, pack_weights=True)


def test_a_failed_compilation_says_so_in_one_line(monkeypatch):
    def failing():
        def step(*args):
            raise RuntimeError("no C++ compiler found\nlong details")
        return step

    monkeypatch.setattr(compiled_decoding, "_compiled_step", failing)
    with pytest.raises(RuntimeError) as caught:
        _tiny_decoder().generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, eos_token_id=-1, compile=True)
    message = str(caught.value)
    assert message.startswith("compile=True: the first compiled decoding step failed (no C++ compiler found)")
    assert "\n" not in message


@pytest.mark.needs_cxx
def test_compiled_steps_ignore_what_free_cache_slots_held(monkeypatch):
    """Regression: free slots of the cache are attended with weight 0, and 0 * NaN from
    uninitialised storage turned whole rows into NaN."""
    from attnlab.layers.kv_cache import KVCache

    grow = KVCache._grow

    def grow_with_nan(stored, new, room, length):
        grown = grow(stored, new, room, length)
        return grown.fill_(float("nan")) if stored is None else grown

    model = _tiny_decoder()
    ids = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    eager = model.generate(ids, mask, max_new_tokens=6, eos_token_id=-1)
    monkeypatch.setattr(KVCache, "_grow", staticmethod(grow_with_nan))
    compiled = model.generate(ids, mask, max_new_tokens=6, eos_token_id=-1, compile=True)
    assert compiled.sequences.tolist() == eager.sequences.tolist()


@needs_mkl
@pytest.mark.parametrize("batch", [4, 9])
def test_generate_takes_the_packed_products_from_batch_4_and_gives_the_same_tokens(
        monkeypatch, packed_products, batch):
    # where the native few-row kernel or the native step serves (up to 8 rows), it takes the steps
    monkeypatch.setattr(generation, "serves_rows", lambda rows: False)
    monkeypatch.setattr(generation, "unserved_reason", lambda model, rows: "the module path, for the test")
    model = _tiny_decoder()
    ids = torch.randint(1, 50, (batch, 5))
    plain = model.generate(ids, max_new_tokens=16, eos_token_id=-1, pack_weights=False)
    assert packed_products["packed"] == 0
    packed = model.generate(ids, max_new_tokens=16, eos_token_id=-1)
    assert packed_products["packed"] > 0
    assert packed.sequences.tolist() == plain.sequences.tolist()


@needs_mkl
@pytest.mark.skipif(not serves_rows(8), reason="the native kernel cannot be built here")
def test_generate_leaves_batches_up_to_8_to_the_native_kernel_and_packs_past_them(monkeypatch,
                                                                                   packed_products):
    # the module path's products (the native decoding step, where it serves, never packs)
    monkeypatch.setattr(generation, "unserved_reason", lambda model, rows: "the module path, for the test")
    model = _tiny_decoder()
    model.generate(torch.randint(1, 50, (8, 5)), max_new_tokens=16, eos_token_id=-1)
    assert packed_products["packed"] == 0
    model.generate(torch.randint(1, 50, (9, 5)), max_new_tokens=16, eos_token_id=-1)
    assert packed_products["packed"] > 0


def test_compile_refuses_a_model_with_hooks():
    from attnlab.inspect.compute.heads import mask_heads

    model = _tiny_decoder()
    ids = torch.tensor([[1, 2, 3]])
    with mask_heads(model, torch.ones(2, 4)), pytest.raises(ValueError, match="does not run module hooks"):
        model.generate(ids, max_new_tokens=2, compile=True)
    handle = model.layers[1].feed_forward.register_forward_pre_hook(lambda module, args: None)
    with pytest.raises(ValueError, match="layers.1.feed_forward has forward hooks"):
        model.generate(ids, max_new_tokens=2, compile=True)
    handle.remove()
    model.layers[0].self_attn.forward = lambda *args, **kwargs: None  # patched on the instance
    with pytest.raises(ValueError, match="may not run layers.0.self_attn's forward, set on the module"):
        model.generate(ids, max_new_tokens=2, compile=True)


@pytest.mark.needs_cxx
def test_a_compiled_model_generates_with_packed_weights_on(packed_products):
    """Regression: inside model.compile() the packed operator broke inductor's lowering;
    the plain product runs there."""
    model = _tiny_decoder()
    ids = torch.randint(1, 50, (4, 5))
    eager = model.generate(ids, max_new_tokens=16, eos_token_id=-1)
    model.compile()
    compiled = model.generate(ids, max_new_tokens=16, eos_token_id=-1)
    assert compiled.sequences.tolist() == eager.sequences.tolist()


@pytest.mark.needs_cxx
def test_compiled_steps_of_a_model_cut_to_fewer_layers_than_its_config():
    """Regression: the compiled steps took the cache's layers (the config's count), not the model's."""
    model = _tiny_decoder()
    model.layers = model.layers[:1]
    ids = torch.randint(1, 50, (2, 5))
    eager = model.generate(ids, max_new_tokens=4, eos_token_id=-1, pack_weights=False)
    compiled = model.generate(ids, max_new_tokens=4, eos_token_id=-1, compile=True)
    assert compiled.sequences.tolist() == eager.sequences.tolist()
