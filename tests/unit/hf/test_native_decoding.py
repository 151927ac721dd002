"""transformers decoders through attnlab's native decoding step (``attnlab.hf.native_decoding``):
per family, greedy tokens and every step's logits against transformers' own eager ``generate``;
the models and calls it leaves to transformers, each with its reason."""

from __future__ import annotations

import pytest
import torch

from attnlab import _dispatch, _precision
from attnlab.hf.native_decoding import NativeSteps, native_layout, unserved_reason
from attnlab.hf.opening import as_inspectable

transformers = pytest.importorskip("transformers", reason="the reference is transformers' own generate")
needs_kernel = pytest.mark.skipif(_dispatch.native_unavailable_reason("decode_step") is not None,
                                  reason="the native kernel cannot be built here (no compiler or ninja)")

VOCAB = 101
SIZES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128, pad_token_id=0,
             bos_token_id=1, eos_token_id=2)
FAMILIES = {
    "llama": lambda **extra: transformers.LlamaConfig(**SIZES, **extra),
    # a window shorter than prompt + new tokens, so that it cuts
    "mistral": lambda **extra: transformers.MistralConfig(**SIZES, sliding_window=5, **extra),
    "qwen2": lambda **extra: transformers.Qwen2Config(**SIZES, **extra),  # query/key/value biases
    "phi3": lambda **extra: transformers.Phi3Config(**SIZES, **extra),  # fused qkv and gate/up products
    "qwen2, a window on layer 2": lambda **extra: transformers.Qwen2Config(
        **SIZES, use_sliding_window=True, sliding_window=4, max_window_layers=1, **extra),
    # query/key norms per head
    "qwen3": lambda **extra: transformers.Qwen3Config(**SIZES, head_dim=16, **extra),
    # query/key norms over all heads; norms after attention and the feed-forward net, none before
    "olmo2": lambda **extra: transformers.Olmo2Config(**SIZES, **extra),
    # 1 + w norms, four per layer, scaled embeddings, a window on every other layer, soft caps
    # small enough to bite
    "gemma2": lambda **extra: transformers.Gemma2Config(
        **SIZES, head_dim=16, sliding_window=4, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0, **extra),
    # query/key norms, sliding layers with their own rotary angles
    "gemma3": lambda **extra: transformers.Gemma3TextConfig(
        **SIZES, head_dim=16, sliding_window=4, query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "full_attention"], **extra),
    "llama, biases, GELU, untied": lambda **extra: transformers.LlamaConfig(
        **SIZES, attention_bias=True, mlp_bias=True, hidden_act="gelu_pytorch_tanh",
        tie_word_embeddings=False, **extra),
}


def _model(config) -> torch.nn.Module:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # weights large enough that the tokens differ from step to step
        for name, parameter in model.named_parameters():
            parameter.normal_(1.0, 0.2) if "norm" in name else parameter.normal_(0.0, 0.3)
    return model


def _prompt(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (batch, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, :3] = 0  # left padding
    return ids, mask


@needs_kernel
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("batch", [1, 2])
def test_greedy_tokens_and_each_step_s_logits_are_transformers_eager_ones(family, batch):
    model = _model(FAMILIES[family]())
    ids, mask = _prompt(batch)
    reference = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                               eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    wrapped = as_inspectable(model)
    assert wrapped.unserved_reason(batch) is None
    out = wrapped.generate(ids, attention_mask=mask, max_new_tokens=20, output_attentions=False,
                           eos_token_id=-1)
    assert out.attentions is None
    assert torch.equal(out.sequences, reference.sequences)
    # every step's logits, fed transformers' own tokens
    layout = native_layout(model)
    steps = NativeSteps(model, layout, ids, mask, ids.shape[1] + 20)
    for step, expected in enumerate(reference.logits):
        if step:
            steps(reference.sequences[:, ids.shape[1] + step - 1])
        torch.testing.assert_close(steps.logits, expected, atol=1e-4, rtol=0)


@needs_kernel
def test_a_row_that_meets_eos_continues_with_pad_as_transformers_does():
    model = _model(FAMILIES["llama"]())
    ids, mask = _prompt(2)
    free = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                          eos_token_id=None)
    eos = int(free[0, ids.shape[1] + 3])  # a token row 0 generates: it stops there
    reference = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                               eos_token_id=eos, pad_token_id=0)
    out = as_inspectable(model).generate(ids, attention_mask=mask, max_new_tokens=12, output_attentions=False,
                                         eos_token_id=eos, pad_token_id=0)
    assert torch.equal(out.sequences, reference)


def _refused(config_or_model, expected: str, batch: int = 1, **options) -> None:
    model = config_or_model if isinstance(config_or_model, torch.nn.Module) else _model(config_or_model)
    reason = unserved_reason(model, batch, **options)
    assert reason is not None and expected in reason, reason


def test_unsupported_features_keep_transformers_path_and_say_why():
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    _refused(FAMILIES["llama"](rope_parameters=dynamic), "rope type 'dynamic'")
    _refused(transformers.GPTNeoXConfig(**SIZES), "model_type 'gpt_neox'")
    _refused(FAMILIES["phi3"](rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                "partial_rotary_factor": 0.5}), "partial rotary")
    _refused(FAMILIES["llama"](), "past the 8 rows", batch=9)
    _refused(FAMILIES["llama"](), "weights are asked for", output_attentions=True)
    _refused(FAMILIES["llama"](), "sampling", do_sample=True)
    _refused(FAMILIES["llama"](), "repetition_penalty", repetition_penalty=1.2)


def test_a_forward_hook_keeps_transformers_path_and_its_effect():
    model = _model(FAMILIES["llama"]())
    model.model.layers[1].mlp.register_forward_hook(lambda module, args, output: output * 0)
    _refused(model, "model.layers.1.mlp has forward hooks")
    ids, mask = _prompt(1)
    reference = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                               eos_token_id=None)
    out = as_inspectable(model).generate(ids, attention_mask=mask, max_new_tokens=6, output_attentions=False,
                                         eos_token_id=-1)
    assert torch.equal(out.sequences, reference)


def test_a_norm_that_computes_something_else_is_refused():
    model = _model(FAMILIES["llama"]())
    norm = model.model.layers[0].post_attention_layernorm
    norm.variance_epsilon = 0.5  # the final norm's differs: the kernel takes one epsilon
    _refused(model, "differs in epsilon")
    model = _model(FAMILIES["llama"]())
    eps = model.model.norm.variance_epsilon
    model.model.layers[1].input_layernorm = torch.nn.LayerNorm(64, eps=eps, bias=False)
    _refused(model, "input_layernorm: LayerNorm computes something else than an RMSNorm")


@needs_kernel
def test_asking_for_weights_keeps_transformers_path_and_eager_s_weights():
    """The native step records no weights for transformers models: weights come from
    attnlab's attention function on transformers' path, equal to eager's (padded batches:
    test_hf_backend.py)."""
    model = _model(FAMILIES["qwen2"]())
    ids, mask = _prompt(1)
    reference = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                               eos_token_id=None, output_attentions=True, return_dict_in_generate=True)
    out = as_inspectable(model).generate(ids, attention_mask=mask, max_new_tokens=5, eos_token_id=-1)
    assert torch.equal(out.sequences, reference.sequences)
    # transformers' own output-capturing hooks, installed now, record nothing outside such calls
    assert unserved_reason(model, 1) is None
    for step, (ours, theirs) in enumerate(zip(out.attentions, reference.attentions)):
        for got, want in zip(ours.values(), theirs):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0, msg=f"step {step}")


@needs_kernel
@pytest.mark.parametrize("family", ["qwen3", "gemma2"])  # packed q/k/v copies; 1 + w norm copies
def test_the_layout_is_read_once_and_follows_every_change_of_the_weights(family):
    model = _model(FAMILIES[family]())
    ids, mask = _prompt(1)
    layout = native_layout(model)
    assert native_layout(model) is layout  # kept: reading probes every norm and copies weights

    def tokens_agree() -> None:
        reference = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                   eos_token_id=None)
        out = as_inspectable(model).generate(ids, attention_mask=mask, max_new_tokens=8,
                                             output_attentions=False, eos_token_id=-1)
        assert torch.equal(out.sequences, reference)

    attention = model.model.layers[0].self_attn
    norm = model.model.layers[0].input_layernorm
    # in place under no_grad: the version counter moves, the layout is read anew
    with torch.no_grad():
        attention.k_proj.weight.mul_(-1.5)
    assert native_layout(model) is not layout
    tokens_agree()
    # through .data no counter moves: the kept layout's own copies (the packed q/k/v weight,
    # the first norm's weight, 1 + w in Gemma) go stale until a call refills them
    kept = native_layout(model)
    qkv, first_norm = kept.weights[2], kept.weights[0]
    queries = attention.q_proj.weight.shape[0]
    attention.q_proj.weight.data.mul_(-2.0)
    norm.weight.data.add_(0.5)
    assert native_layout(model) is kept
    assert not torch.equal(qkv[:queries], attention.q_proj.weight)
    tokens_agree()
    assert torch.equal(qkv[:queries], attention.q_proj.weight)
    assert torch.equal(first_norm, norm.weight if family == "qwen3" else 1.0 + norm.weight)
    # a replaced module: read anew, and a module the step does not compute is refused
    attention.v_proj = torch.nn.Sequential(attention.v_proj)
    assert "v_proj" in unserved_reason(model, 1)


HALF_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@needs_kernel
@pytest.mark.parametrize("dtype", HALF_DTYPES.values(), ids=HALF_DTYPES.keys())
@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3", "gemma2", "gemma3"])
def test_half_precision_models_step_closer_to_float64_than_their_own_forward(family, dtype):
    """The matrices and the cache stay in the model's dtype, the step computes in float32:
    each step's logits against a float64 forward of the same rounded weights are within the
    dtype's tolerance and, over the steps, closer than transformers' own forward in the dtype."""
    model = _model(FAMILIES[family]()).to(dtype)
    exact_model = _model(FAMILIES[family]()).to(dtype).double()
    assert unserved_reason(model, 2) is None
    layout = native_layout(model)
    assert {t.dtype for t in layout.weights if t is not None and t.dim() == 2} == {dtype}
    ids, mask = _prompt(2)
    new = torch.randint(3, VOCAB, (2, 8), generator=torch.Generator().manual_seed(2))
    steps = NativeSteps(model, layout, ids, mask, ids.shape[1] + new.shape[1])
    native_errors, own_errors = [], []
    with torch.no_grad():
        for step in range(new.shape[1]):
            logits = steps(new[:, step])
            sequence = torch.cat((ids, new[:, : step + 1]), dim=1)
            full = torch.cat((mask, torch.ones(2, step + 1, dtype=mask.dtype)), dim=1).bool()
            # each row alone, without its padding (a padded row's masked positions give NaN in float64)
            exact = torch.cat([exact_model(row[keep][None]).logits[:, -1] for row, keep in zip(sequence, full)])
            own = torch.cat([model(row[keep][None]).logits[:, -1] for row, keep in zip(sequence, full)])
            assert logits.dtype == torch.float32
            native_errors.append(float((logits.double() - exact).abs().max()))
            own_errors.append(float((own.double() - exact).abs().max()))
            assert native_errors[-1] <= 16 * torch.finfo(dtype).eps * float(exact.abs().max())
    assert sum(native_errors) <= sum(own_errors)
    assert all(store.dtype == dtype for store in steps.arguments[1])  # the cache in the model's dtype


@needs_kernel
def test_half_precision_generation_picks_float64_s_tokens_where_they_clearly_lead():
    model = _model(FAMILIES["qwen3"]()).to(torch.bfloat16)
    ids, mask = _prompt(2)
    wrapped = as_inspectable(model)
    assert wrapped.unserved_reason(2) is None
    out = wrapped.generate(ids, attention_mask=mask, max_new_tokens=20, output_attentions=False,
                           eos_token_id=-1)
    def each_row(forward) -> torch.Tensor:  # [B, 20, V]: the logits that chose each new token
        # each row alone, without its padding (a padded row's masked positions give NaN in float64)
        return torch.stack([forward(row[keep][None]).logits[0, -21:-1].double()
                            for row, keep in zip(out.sequences, out.attention_mask)])

    with torch.no_grad():
        own = each_row(model)
        exact = each_row(model.double())
    tolerance = (own - exact).abs().amax(-1)  # [B, 20]: the model's own error in bfloat16
    chosen = out.sequences[:, 7:]
    clear = exact.topk(2, dim=-1).values.diff(dim=-1)[..., 0].abs() > 2 * tolerance
    assert int(clear.sum()) >= 10  # the premise: enough clear steps to check
    assert (chosen[clear] == exact.argmax(-1)[clear]).all()


def test_mixed_or_unserved_dtypes_keep_transformers_path_and_say_why():
    model = _model(FAMILIES["llama"]()).to(torch.bfloat16)
    model.model.layers[1].mlp.float()
    _refused(model, "the weight matrices are torch.bfloat16, torch.float32, not all one of float32, "
                    "bfloat16 and float16")
    _refused(_model(FAMILIES["llama"]()).double(), "the weight matrices are torch.float64")


@needs_kernel
def test_a_bfloat16_prompt_pass_multiplies_in_float32_where_the_cpu_emulates_bfloat16(monkeypatch):
    """The numbers of transformers' own bfloat16 forward (a bfloat16 GEMM sums in float32 too),
    from float32 GEMMs where torch would emulate bfloat16 products (an AVX2 CPU)."""
    model = _model(FAMILIES["qwen2"]()).to(torch.bfloat16)  # with biases
    products = []
    linear = _precision.linear
    monkeypatch.setattr(_precision, "linear", lambda *args, **kwargs: products.append(1) or linear(*args, **kwargs))
    ids, mask = _prompt(2)
    steps = NativeSteps(model, native_layout(model), ids, mask, ids.shape[1] + 4)
    emulated = _precision.bf16_is_emulated(torch.zeros(1, dtype=torch.bfloat16))
    assert len(products) == (2 * 7 + 1 if emulated else 0)  # q, k, v, o, gate, up, down per layer; the LM head
    with torch.no_grad():
        own = model(ids, attention_mask=mask).logits[:, -1].float()
    assert float((steps.logits - own).abs().max()) <= 8 * torch.finfo(torch.bfloat16).eps * float(own.abs().max())


@needs_kernel
def test_a_gemma2_directory_opens_though_transformers_refuses_it_sdpa(tmp_path):
    """transformers has no sdpa for Gemma 2: opening asked for it and failed; it now takes
    transformers' eager attention where attnlab's is not attached."""
    from attnlab.hf.opening import open_transformers

    model = _model(FAMILIES["gemma2"]())
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="does not support an attention implementation"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa")
    opened = open_transformers(tmp_path)
    ids, _ = _prompt(1)
    assert opened.unserved_reason(1) is None
    out = opened.generate(ids, max_new_tokens=8, output_attentions=False, eos_token_id=-1)
    expected = model.generate(input_ids=ids, max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert torch.equal(out.sequences, expected)
