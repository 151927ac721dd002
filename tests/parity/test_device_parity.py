"""The device suite: attnlab on the device ``--device`` names (``pytest --device cuda``;
``make test-cuda``), against references computed on the CPU.

Every path is meant to be device-generic: attnlab's attention modules, its decoders'
generation (whose CPU-only native kernels stand aside elsewhere), and transformers models
served by attnlab's attention function (exact weights, statistics, chosen rows, head
masks). On the CPU (the default) the same tests run in ``make test``, so they cannot rot.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab import MultiHeadAttention
from attnlab.attention.exact import exact_attention
from attnlab.inspect import capture_attention
from attnlab.layers.decoder_config import DecoderConfig
from attnlab.models.decoder import DecoderForCausalLM

transformers = pytest.importorskip("transformers")
from attnlab.hf import attach  # noqa: E402

ATOL = 1e-5  # float32 on a GPU (TF32 is off for these tests) against float32 on the CPU


@pytest.fixture(autouse=True)
def _exact_float32(device):
    """TF32 products (a GPU's default for some operations) would differ from the CPU's by ~1e-3."""
    if device.type != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_multihead_attention_on_the_device_equals_torch_nn_on_the_cpu(device):
    torch.manual_seed(0)
    ours = MultiHeadAttention(32, 4, dropout=0.0).eval()
    theirs = nn.MultiheadAttention(32, 4, dropout=0.0, batch_first=True).eval()
    with torch.no_grad():
        ours.in_proj_weight.normal_(0, 0.2)
        theirs.in_proj_weight.copy_(ours.in_proj_weight)
        theirs.in_proj_bias.copy_(ours.in_proj_bias)
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.randn(2, 7, 32)
    keep = torch.ones(2, 7, dtype=torch.bool)
    keep[1, 5:] = False
    want, want_weights = theirs(x, x, x, key_padding_mask=~keep, need_weights=True, average_attn_weights=False)
    ours = ours.to(device)
    with torch.no_grad():
        output, weights = ours(x.to(device), x.to(device), x.to(device), attention_mask=keep.to(device)[:, None, None],
                               need_weights=True)
        fused, _ = ours(x.to(device), x.to(device), x.to(device), attention_mask=keep.to(device)[:, None, None])
    assert output.device.type == device.type
    torch.testing.assert_close(output.cpu(), want, rtol=0, atol=ATOL)
    torch.testing.assert_close(fused.cpu(), want, rtol=0, atol=ATOL)
    torch.testing.assert_close(weights.cpu(), want_weights, rtol=0, atol=ATOL)


def test_exact_attention_on_the_device_equals_float64_on_the_cpu(device):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 8, 40, 16), torch.randn(2, 2, 40, 16), torch.randn(2, 2, 40, 16)
    grouped_k, grouped_v = k.repeat_interleave(4, 1).double(), v.repeat_interleave(4, 1).double()
    scores = q.double() @ grouped_k.transpose(-1, -2) / 4.0
    scores = scores.masked_fill(torch.ones(40, 40, dtype=torch.bool).triu(1), float("-inf"))
    want = scores.softmax(-1)
    output, weights = exact_attention(nn.Module(), q.to(device), k.to(device), v.to(device), None, scaling=None,
                                      causal=True, rows_per_block=7, keep_weights=True)
    torch.testing.assert_close(weights.cpu().double(), want, rtol=0, atol=1e-6)
    torch.testing.assert_close(output.cpu().double(), (want @ grouped_v).transpose(1, 2), rtol=0, atol=1e-5)


def _decoder() -> DecoderForCausalLM:
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=50, d_model=32, num_layers=2, num_heads=4, d_ff=64, num_kv_heads=2)
    return DecoderForCausalLM(config).eval()


def test_own_decoder_generates_the_cpus_tokens_and_weights_on_the_device(device):
    model = _decoder()
    prompt = torch.randint(1, 50, (2, 6))
    with torch.no_grad():
        want = model.generate(prompt, max_new_tokens=5, output_attentions=True)
        with capture_attention(model) as captured:
            model(prompt)
    model = model.to(device)
    with torch.no_grad():
        got = model.generate(prompt.to(device), max_new_tokens=5, output_attentions=True)
        with capture_attention(model) as on_device:
            model(prompt.to(device))
    assert torch.equal(got.sequences.cpu(), want.sequences)
    for name, weights in captured.attentions.items():
        torch.testing.assert_close(on_device.attentions[name].cpu(), weights, rtol=0, atol=ATOL)


def _llama() -> "transformers.LlamaForCausalLM":
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, vocab_size=100,
                                      max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config).eval()


def test_served_transformers_model_on_the_device_gives_eagers_weights_from_the_cpu(device):
    model = _llama()
    ids = torch.randint(0, 100, (2, 24))
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, :4] = 0
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(ids, attention_mask=mask, output_attentions=True)
    model.set_attn_implementation("sdpa")
    with torch.no_grad(), attach(model, statistics=True) as cpu_statistics:
        model(ids, attention_mask=mask)
    model = model.to(device)
    real = mask.bool()
    inputs = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    with torch.no_grad():
        with attach(model, layers="all") as seen:
            out = model(**inputs)
        with attach(model, layers="all", rows=[0, 10, -1]) as rows:
            model(**inputs)
        with attach(model, statistics=True) as statistics:
            model(**inputs)
        with attach(model, layers="all", head_mask={"layer_1": [0, 3]}) as masked:
            model(**inputs)
    torch.testing.assert_close(out.logits.cpu()[real], eager.logits[real], rtol=0, atol=ATOL)
    for index, name in enumerate(["layer_1", "layer_2"]):
        want = eager.attentions[index].masked_fill(~real[:, None, :, None], 0.0)  # padding rows: zeros
        torch.testing.assert_close(seen.attentions[name].cpu(), want, rtol=0, atol=1e-6)
        torch.testing.assert_close(rows.attentions[name].cpu(), want[:, :, [0, 10, 23]], rtol=0, atol=1e-6)
    assert torch.all(masked.attentions["layer_1"][:, [0, 3]] == 0)
    for name, values in cpu_statistics.statistics().items():
        for statistic, per_head in values.items():
            got = statistics.statistics()[name][statistic]
            assert got == pytest.approx(per_head, abs=1e-5), (name, statistic)
