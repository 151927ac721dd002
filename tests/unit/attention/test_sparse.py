"""SparseAttention against a dense attention with the equivalent mask (float64 golden).

The reference below is written from the documented semantics only: it builds the full
``[T, T]`` pattern, runs ordinary masked softmax attention, and adds the pooled
summary computed the long way (project every position, then average).
"""

from __future__ import annotations

import copy
import math
import random
from typing import NamedTuple, Optional

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab.attention.sparse.block_sparse import BlockSparseWeights, block_sparse_attention
from attnlab.attention.sparse import SparseAttention


class Reference(NamedTuple):
    output: torch.Tensor  # [B, T, E]
    mixing: torch.Tensor  # [B, H, T, T]: per-head output before `dense` = mixing @ v
    before_dense: torch.Tensor  # [B, H, T, D]


def dense_reference(attn: SparseAttention, x: torch.Tensor, valid: Optional[torch.Tensor]) -> Reference:
    B, T, E = x.shape
    H, D, L, w = attn.num_heads, attn.head_dim, attn.block_size, attn.window

    def heads(layer, inputs):
        return F.linear(inputs, layer.weight, layer.bias).view(B, T, H, D).transpose(1, 2)

    q, k, v = heads(attn.local_q, x), heads(attn.local_k, x), heads(attn.local_v, x)
    if attn.rotary is not None:
        q, k = attn.rotary(q), attn.rotary(k)
    position = torch.arange(T)
    allowed = (position[:, None] // L - position[None, :] // L).abs() <= w  # [T, T]
    globals_ = [p for p in attn.global_tokens if p < T]
    allowed[globals_, :] = True
    allowed[:, globals_] = True
    valid = torch.ones(B, T, dtype=torch.bool) if valid is None else valid
    allowed = allowed[None, None] & valid[:, None, None, :]  # [B, 1, T, T]
    has_key = allowed.any(dim=-1, keepdim=True)  # [B, 1, T, 1]
    scores = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores.masked_fill(~has_key, 0.0), dim=-1) * allowed  # [B, H, T, T]
    mixing = probs
    if attn.global_summary:
        global_queries = heads(attn.global_q, x)  # [B, H, T, D]
        weights = valid[:, None, :, None].to(x.dtype)
        pooled = (global_queries * weights).sum(2, keepdim=True) / weights.sum(2, keepdim=True).clamp_min(1)
        summary_scores = pooled @ heads(attn.global_k, x).transpose(-1, -2) / math.sqrt(D)  # [B, H, 1, T]
        key_ok = valid[:, None, None, :]
        summary_scores = summary_scores.masked_fill(~key_ok, float("-inf"))
        any_key = key_ok.any(dim=-1, keepdim=True)
        summary = torch.softmax(summary_scores.masked_fill(~any_key, 0.0), dim=-1) * key_ok
        mixing = probs + summary * has_key
    before_dense = mixing @ v  # [B, H, T, D]
    output = F.linear(before_dense.transpose(1, 2).reshape(B, T, E), attn.dense.weight, attn.dense.bias)
    return Reference(output, mixing, before_dense)


class Case(NamedTuple):
    batch: int
    heads: int
    head_dim: int
    length: int
    block_size: int
    window: int
    global_tokens: tuple
    summary: bool
    lengths: Optional[tuple]  # real tokens per sequence; None = no padding mask


def random_case(seed: int) -> Case:
    rng = random.Random(seed)
    length = rng.randint(1, 70)
    batch = rng.randint(1, 3)
    lengths = None
    if rng.random() < 0.7:
        lengths = tuple(rng.randint(0 if rng.random() < 0.2 else 1, length) for _ in range(batch))
    return Case(
        batch=batch,
        heads=rng.choice([1, 2, 4]),
        head_dim=rng.choice([2, 4, 8]),
        length=length,
        block_size=rng.randint(1, 20),
        window=rng.randint(0, 3),
        global_tokens=tuple(rng.sample(range(length + 4), k=rng.randint(0, 3))),
        summary=rng.random() < 0.75,
        lengths=lengths,
    )


def build(case: Case, seed: int = 0, **options) -> tuple[SparseAttention, torch.Tensor, Optional[torch.Tensor]]:
    torch.manual_seed(seed)
    attn = SparseAttention(
        case.heads * case.head_dim,
        case.heads,
        case.block_size,
        dropout=0.0,
        window=case.window,
        global_summary=case.summary,
        global_tokens=case.global_tokens,
        **options,
    )
    x = torch.randn(case.batch, case.length, case.heads * case.head_dim)
    valid = None
    if case.lengths is not None:
        valid = torch.arange(case.length)[None, :] < torch.tensor(case.lengths)[:, None]  # [B, T]
    return attn, x, valid


def tolerance(attn: SparseAttention, x: torch.Tensor, valid: Optional[torch.Tensor], golden: torch.Tensor) -> float:
    """A few times the error of the same dense computation done in float32."""
    float32_error = (dense_reference(attn, x, valid).output.double() - golden).abs().max().item()
    return 8 * max(float32_error, torch.finfo(torch.float32).eps * (1 + golden.abs().max().item()))


CASES = [random_case(seed) for seed in range(24)]


@pytest.mark.parametrize("case", CASES, ids=[f"case{index}" for index in range(len(CASES))])
def test_output_and_gradients_match_dense_reference(case: Case) -> None:
    attn, x, valid = build(case)
    golden_attn = copy.deepcopy(attn).double()
    x.requires_grad_(True)
    x64 = x.detach().double().requires_grad_(True)

    out, _ = attn(x, x, x, attention_mask=valid)
    golden = dense_reference(golden_attn, x64, valid).output
    atol = tolerance(attn, x.detach(), valid, golden.detach())
    torch.testing.assert_close(out.double(), golden, atol=atol, rtol=0)

    upstream = torch.randn(out.shape, dtype=torch.float64)
    (out.double() * upstream).sum().backward()
    (golden * upstream).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=20 * atol, rtol=1e-4)
    for (name, p32), (_, p64) in zip(attn.named_parameters(), golden_attn.named_parameters()):
        torch.testing.assert_close(p32.grad.double(), p64.grad, atol=20 * atol, rtol=1e-4, msg=name)


@pytest.mark.parametrize("case", CASES[:8], ids=[f"case{index}" for index in range(8)])
def test_dense_weights_are_the_exact_mixing_matrix(case: Case) -> None:
    attn, x, valid = build(case)
    golden_attn = copy.deepcopy(attn).double()
    _, weights = attn(x, x, x, attention_mask=valid, need_weights=True)
    reference = dense_reference(golden_attn, x.double(), valid)
    assert weights.shape == (case.batch, case.heads, case.length, case.length)
    torch.testing.assert_close(weights.double(), reference.mixing, atol=1e-5, rtol=0)


def test_block_layout_weights_draw_the_same_dense_matrix() -> None:
    case = Case(2, 2, 4, 45, 8, 1, (0, 30), True, (45, 20))
    attn, x, valid = build(case)
    _, dense = attn(x, x, x, attention_mask=valid, need_weights=True)
    attn.weights_layout = "blocks"
    _, blocks = attn(x, x, x, attention_mask=valid, need_weights=True)
    assert isinstance(blocks, BlockSparseWeights)
    N, K = 6, 3 * 8 + 2
    assert blocks.local.shape == (2, 2, N, 8, K)
    assert blocks.key_positions.shape == (N, K)
    assert blocks.global_rows.shape == (2, 2, 2, 45)
    assert blocks.summary.shape == (2, 2, 1, 45)
    torch.testing.assert_close(blocks.to_dense(), dense)


def test_weights_with_head_mask_and_average() -> None:
    case = Case(1, 4, 4, 20, 4, 1, (), True, None)
    attn, x, _ = build(case)
    head_mask = torch.tensor([1.0, 0.0, 0.5, 1.0])
    _, full = attn(x, x, x, need_weights=True)
    out, masked = attn(x, x, x, need_weights=True, head_mask=head_mask)
    torch.testing.assert_close(masked, full * head_mask.view(1, 4, 1, 1))
    _, averaged = attn(x, x, x, need_weights=True, average_attn_weights=True, head_mask=head_mask)
    torch.testing.assert_close(averaged, masked.mean(dim=1))


def test_rotary_matches_reference() -> None:
    case = Case(2, 2, 8, 37, 8, 1, (3,), True, (37, 11))
    attn, x, valid = build(case, rotary=True)
    golden = dense_reference(copy.deepcopy(attn).double(), x.double(), valid).output
    out, _ = attn(x, x, x, attention_mask=valid)
    torch.testing.assert_close(out.double(), golden, atol=1e-5, rtol=0)


def test_distinct_key_and_value_tensors_of_the_same_length() -> None:
    torch.manual_seed(0)
    attn = SparseAttention(8, 2, 4, dropout=0.0, window=1)
    x, y = torch.randn(1, 10, 8), torch.randn(1, 10, 8)
    out, _ = attn(x, y, y)
    same, _ = attn(x, x, x)
    assert out.shape == (1, 10, 8) and not torch.allclose(out, same)


# --------------------------------------------------------------------- masks
def test_mask_forms_agree() -> None:
    case = Case(3, 2, 4, 30, 8, 1, (0,), True, None)
    attn, x, _ = build(case)
    valid = torch.tensor([[True] * 30, [True] * 12 + [False] * 18, [False] * 30])
    by_padding, _ = attn(x, x, x, attention_mask=valid)
    by_encoder_mask, _ = attn(x, x, x, valid[:, None, None, :])
    by_rank3, _ = attn(x, x, x, valid[:, None, :])
    by_int, _ = attn(x, x, x, attention_mask=valid.long())
    by_float, _ = attn(x, x, x, valid.float()[:, None, None, :])
    by_rank2, _ = attn(x, x, x, valid)
    for other in (by_encoder_mask, by_rank3, by_int, by_float, by_rank2):
        torch.testing.assert_close(other, by_padding)
    with pytest.raises(TypeError, match="key_padding_mask is not taken"):
        attn(x, x, x, key_padding_mask=valid)
    additive = torch.zeros(3, 30).masked_fill(~valid, float("-inf"))
    with pytest.raises(TypeError, match="holding -inf besides 0 and 1"):
        attn(x, x, x, additive[:, None, None, :])


def test_padding_keys_do_not_change_real_positions() -> None:
    case = Case(1, 2, 4, 24, 8, 1, (0,), True, None)
    attn, x, _ = build(case)
    valid = torch.arange(24)[None] < 17
    out, _ = attn(x, x, x, attention_mask=valid)
    noisy = x.clone()
    noisy[:, 17:] = torch.randn(1, 7, 8) * 100
    noisy_out, _ = attn(noisy, noisy, noisy, attention_mask=valid)
    torch.testing.assert_close(noisy_out[:, :17], out[:, :17])


def test_fully_masked_rows_are_zero_with_zero_gradients() -> None:
    q, k, v = (torch.randn(2, 2, 20, 4, requires_grad=True) for _ in range(3))
    valid = torch.zeros(2, 20, dtype=torch.bool)
    valid[1, :3] = True  # sequence 1: only block 0 has keys
    out, _, row_has_key = block_sparse_attention(q, k, v, valid, block_size=4, window=0)
    assert torch.equal(row_has_key[0], torch.zeros(20, dtype=torch.bool))
    assert torch.equal(row_has_key[1], torch.arange(20) < 4)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.equal(out[1, :, 4:], torch.zeros_like(out[1, :, 4:]))
    out.sum().backward()
    for tensor in (q, k, v):
        assert torch.isfinite(tensor.grad).all()
    assert torch.equal(q.grad[0], torch.zeros_like(q.grad[0]))


def test_fully_masked_sequence_gives_zero_before_projection() -> None:
    torch.manual_seed(0)
    attn = SparseAttention(8, 2, 4, dropout=0.0, window=1, bias=False)
    x = torch.randn(2, 9, 8, requires_grad=True)
    valid = torch.tensor([[True] * 9, [False] * 9])
    out, weights = attn(x, x, x, attention_mask=valid, need_weights=True)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(weights[1], torch.zeros_like(weights[1]))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


# --------------------------------------------------------------- the article
class ArticleSparseAttention(torch.nn.Module):
    """The article's SparseAttention, transcribed (including its defects)."""

    def __init__(self, d_model, num_heads, block_size=32, dropout=0.1):
        super().__init__()
        self.d_model, self.num_heads, self.block_size = d_model, num_heads, block_size
        self.depth = d_model // num_heads
        self.local_q = torch.nn.Linear(d_model, d_model)
        self.local_k = torch.nn.Linear(d_model, d_model)
        self.local_v = torch.nn.Linear(d_model, d_model)
        self.global_q = torch.nn.Linear(d_model, d_model)
        self.global_k = torch.nn.Linear(d_model, d_model)
        self.dense = torch.nn.Linear(d_model, d_model)
        self.dropout = torch.nn.Dropout(dropout)

    def block_local_attention(self, query, key, value, mask=None):
        num_blocks = query.shape[2] // self.block_size
        outputs = []
        for q, k, v in zip(*(t.chunk(num_blocks, dim=2) for t in (query, key, value))):
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.depth)
            if mask is not None:
                scores = scores.masked_fill(mask == 0, -1e9)
            outputs.append(torch.matmul(self.dropout(F.softmax(scores, dim=-1)), v))
        return torch.cat(outputs, dim=2)

    def forward(self, query, key, value, mask=None):
        B = query.size(0)
        split = lambda t: t.view(B, -1, self.num_heads, self.depth).transpose(1, 2)  # noqa: E731
        local = self.block_local_attention(
            split(self.local_q(query)), split(self.local_k(key)), split(self.local_v(value)), mask
        )
        global_q = self.global_q(query).mean(dim=1, keepdim=True)
        scores = torch.matmul(global_q, self.global_k(key).transpose(-2, -1)) / math.sqrt(self.d_model)
        global_context = torch.matmul(F.softmax(scores, dim=-1), value).expand_as(local)
        combined = (local + global_context).transpose(1, 2).contiguous().view(B, -1, self.d_model)
        return self.dense(combined), scores


@pytest.mark.parametrize(
    "length, block_size",
    [(50, 16), (5, 32), (64, 32)],
    ids=["length-not-a-multiple", "shorter-than-a-block", "multiple-of-the-block"],
)
def test_inputs_that_break_the_article_work_here(length: int, block_size: int) -> None:
    torch.manual_seed(0)
    article = ArticleSparseAttention(32, 4, block_size, dropout=0.0).eval()
    x = torch.randn(2, length, 32)
    with pytest.raises(RuntimeError):  # chunk(0) or the model-width summary's shape error
        article(x, x, x)
    case = Case(2, 4, 8, length, block_size, 0, (), True, None)
    attn, _, _ = build(case)
    attn.load_state_dict(article.state_dict())  # same parameter names as the article
    golden = dense_reference(copy.deepcopy(attn).double(), x.double(), None).output
    out, _ = attn(x, x, x)
    torch.testing.assert_close(out.double(), golden, atol=1e-5, rtol=0)


def test_blocks_do_not_leak_when_length_is_not_a_multiple() -> None:
    # The article chunks 50 positions into 3 pieces of 17/17/16; blocks of 16 must hold.
    torch.manual_seed(0)
    attn = SparseAttention(8, 2, 16, dropout=0.0, window=0, global_summary=False)
    x = torch.randn(1, 50, 8, requires_grad=True)
    out, _ = attn(x, x, x)
    out[0, 16].sum().backward()  # position 16 opens block 1 = [16, 32)
    touched = x.grad[0].abs().sum(-1) > 0
    assert torch.equal(touched, (torch.arange(50) >= 16) & (torch.arange(50) < 32))


def test_summary_is_per_head_and_uses_projected_values() -> None:
    torch.manual_seed(0)
    attn = SparseAttention(16, 4, 4, dropout=0.0, window=0)
    with torch.no_grad():
        attn.local_v.weight.zero_()
        attn.local_v.bias.zero_()
        attn.dense.weight.copy_(torch.eye(16))
        attn.dense.bias.zero_()
    x = torch.randn(2, 10, 16)
    out, _ = attn(x, x, x)
    # Every value the article's global part mixes is raw input; ours are projections (here 0).
    torch.testing.assert_close(out, torch.zeros_like(out))
    with torch.no_grad():
        attn.local_v.bias.copy_(torch.arange(16.0))
    out, _ = attn(x, x, x)
    # Block part and summary each mix the constant value rows once: 2 * bias everywhere.
    torch.testing.assert_close(out, 2 * torch.arange(16.0).expand(2, 10, 16))


# ------------------------------------------------------------- cost, errors
class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operator produces."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for item in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(item, torch.Tensor):
                self.largest = max(self.largest, item.numel())
        return result


def test_never_builds_a_length_squared_tensor_forward_or_backward() -> None:
    T, E, H = 2048, 16, 2
    torch.manual_seed(0)
    attn = SparseAttention(E, H, 32, dropout=0.0, window=1, global_tokens=(0, 1000))
    x = torch.randn(1, T, E, requires_grad=True)
    valid = torch.arange(T)[None] < 2000
    with LargestTensor() as recorder:
        out, _ = attn(x, x, x, attention_mask=valid)
        out.sum().backward()
    # Largest pieces: blocks x heads x block x (3 * 32 + 2) scores or T x E activations.
    assert recorder.largest <= T * H * (3 * 32 + 2) * 2
    assert recorder.largest < T * T / 8


def test_training_mode_dropout_changes_output_and_zero_dropout_does_not() -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 40, 16)
    attn = SparseAttention(16, 2, 8, dropout=0.5, window=1).train()
    first, _ = attn(x, x, x)
    second, _ = attn(x, x, x)
    assert not torch.allclose(first, second)
    attn.eval()
    torch.testing.assert_close(attn(x, x, x)[0], attn(x, x, x)[0])
    no_dropout = SparseAttention(16, 2, 8, dropout=0.0, window=1)
    torch.testing.assert_close(no_dropout.train()(x, x, x)[0], no_dropout.eval()(x, x, x)[0])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"block_size": 0}, "block_size"),
        ({"window": -1}, "window"),
        ({"global_tokens": (-1,)}, "global_tokens"),
        ({"weights_layout": "sparse"}, "weights_layout"),
        ({"num_heads": 3}, "divisible"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict, message: str) -> None:
    arguments = {"d_model": 8, "num_heads": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        SparseAttention(**arguments)


def test_cross_attention_is_refused_clearly() -> None:
    attn = SparseAttention(8, 2, 4)
    with pytest.raises(ValueError, match="self-attention over one sequence"):
        attn(torch.randn(1, 5, 8), torch.randn(1, 7, 8), torch.randn(1, 7, 8))


@pytest.mark.parametrize(
    "mask",
    [torch.ones(6, 6, dtype=torch.bool), torch.ones(1, 1, 6, 6, dtype=torch.bool), torch.ones(2, 1, 1, 5)],
    ids=["query-key", "rank4-query-key", "wrong-length"],
)
def test_masks_that_vary_per_query_are_refused(mask: torch.Tensor) -> None:
    attn = SparseAttention(8, 2, 4)
    x = torch.randn(2, 6, 8)
    with pytest.raises(ValueError, match="key-padding masks only"):
        attn(x, x, x, mask)


def test_other_refusals() -> None:
    attn = SparseAttention(8, 2, 4)
    x = torch.randn(1, 6, 8)
    with pytest.raises(ValueError, match="is_causal"):
        attn(x, x, x, is_causal=True)
    with pytest.raises(TypeError, match="float"):
        attn(x, x, x, torch.zeros(1, 1, 1, 6, dtype=torch.float64))
    long = torch.randn(1, 4097, 8)
    with pytest.raises(ValueError, match="weights_layout='blocks'"):
        attn(long, long, long, need_weights=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_runs_on_cuda_and_matches_cpu() -> None:
    case = Case(2, 2, 8, 77, 16, 1, (0,), True, (77, 40))
    attn, x, valid = build(case)
    out_cpu, _ = attn(x, x, x, attention_mask=valid)
    attn_gpu = copy.deepcopy(attn).cuda()
    x_gpu = x.cuda().requires_grad_(True)
    out_gpu, _ = attn_gpu(x_gpu, x_gpu, x_gpu, attention_mask=valid.cuda())
    out_gpu.sum().backward()
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "batch, length, block, window, globals_, padded, contiguous",
    [
        (1, 320, 8, 1, (), False, True),  # windows read in place; the edge blocks gathered
        (3, 256, 8, 2, (7,), True, True),
        (2, 300, 8, 1, (), True, False),  # not whole blocks: padded copies
        (2, 64, 16, 3, (0, 40), False, False),  # windows wider than the sequence
    ],
)
def test_fast_kernel_matches_the_reference_path(
    monkeypatch, batch, length, block, window, globals_, padded, contiguous
) -> None:
    # The GEMM kernel (chunked, with views of contiguous inputs) against the one-call
    # reference path that need_weights takes, outputs and gradients.
    import attnlab.attention.sparse._block_window_kernel as kernel

    monkeypatch.setattr(kernel, "_CHUNK_ELEMENTS", 5 * block * (2 * window + 1) * block)  # several chunks
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, 2, length, 8, dtype=torch.float64) for _ in range(3))
    if not contiguous:
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    valid = None
    if padded:
        valid = torch.arange(length)[None] < torch.tensor([length, length // 2, 5][:batch])[:, None]
    kwargs = {"block_size": block, "window": window, "global_positions": globals_}
    upstream = torch.randn(batch, 2, length, 8, dtype=torch.float64)
    results = []
    for need_weights in (False, True):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out = block_sparse_attention(*leaves, valid, need_weights=need_weights, **kwargs).output
        (out * upstream).sum().backward()
        results.append((out.detach(), *(leaf.grad for leaf in leaves)))
    for fast, reference in zip(*results):
        torch.testing.assert_close(fast, reference, atol=1e-12, rtol=1e-10)


MERGED_CASES = [
    # (batch, length, block, window, globals, real tokens per sequence)
    (1, 512, 32, 1, (0, 256), (461,)),  # padding at the end, globals inside some windows
    (2, 250, 16, 2, (3, 100, 249), (250, 190)),  # not whole blocks
    (2, 96, 32, 1, (50,), (96, 0)),  # a sequence with no key at all
    (1, 300, 8, 0, (7, 8, 299), None),  # globals only, no padding
    (3, 128, 16, 3, (), (128, 64, 5)),  # windows wider than the sequence, no globals
]


def _merged_inputs(batch, length, lengths, hole=False):
    torch.manual_seed(1)
    q, k, v, upstream = (torch.randn(batch, 2, length, 8, dtype=torch.float64) for _ in range(4))
    valid = None
    if lengths is not None:
        valid = torch.arange(length)[None] < torch.tensor(lengths)[:, None]  # [B, T]
        if hole:
            valid[:, length // 3 : length // 3 + 5] = False  # keys removed in the middle too
    return q, k, v, upstream, valid


@pytest.mark.parametrize("hole", [False, True])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("batch, length, block, window, globals_, lengths", MERGED_CASES)
def test_window_and_global_softmax_merge_is_exact(
    monkeypatch, golden, batch, length, block, window, globals_, lengths, hole, fused
) -> None:
    # The windows through the fused kernel (or, without it, GEMM + softmax), the global
    # keys merged through the log-sum-exp, the backward from the saved log-sum-exp:
    # outputs and gradients against dense float64 attention over the same pattern.
    import attnlab.attention.sparse._block_window_kernel as kernel

    if not fused:
        monkeypatch.setattr(kernel, "_flash_with_logsumexp", lambda query: None)
    monkeypatch.setattr(kernel, "_CHUNK_ELEMENTS", 3 * block * (2 * window + 1) * block)  # several chunks
    q, k, v, upstream, valid = _merged_inputs(batch, length, lengths, hole)
    outputs = []
    for fast in (True, False):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        if fast:
            out = block_sparse_attention(
                *leaves, valid, block_size=block, window=window, global_positions=globals_
            ).output
        else:
            out = golden.block_sparse(*leaves, valid, block, window, globals_)
        (out * upstream).sum().backward()
        outputs.append((out.detach(), *(leaf.grad for leaf in leaves)))
    for name, fast, reference in zip(("output", "dq", "dk", "dv"), *outputs):
        assert torch.isfinite(fast).all(), name
        torch.testing.assert_close(fast, reference, atol=1e-12, rtol=1e-10, msg=name)


def test_merged_route_gradcheck() -> None:
    q, k, v, _, valid = _merged_inputs(2, 40, (40, 27), hole=True)
    leaves = [x[:, :, :, :4].clone().requires_grad_(True) for x in (q, k, v)]

    def function(q, k, v):
        return block_sparse_attention(q, k, v, valid, block_size=8, window=1, global_positions=(2, 30)).output

    assert torch.autograd.gradcheck(function, leaves, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)


def test_end_padding_and_globals_keep_most_blocks_on_the_unmasked_fused_call(monkeypatch) -> None:
    # Padding at the sequence end biases only the last blocks' windows; global keys are
    # merged afterwards and do not send any block to a masked call (torch's path).
    monkeypatch.setenv("ATTNLAB_SPARSE_KERNEL", "torch")
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    blocks = {"masked": 0, "unmasked": 0}

    class CountFusedCalls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is flash:
                blocks["masked" if kwargs.get("attn_mask") is not None else "unmasked"] += args[0].shape[0]
            return func(*args, **kwargs)

    T, L = 4096, 64
    q, k, v = (torch.randn(1, 2, T, 16) for _ in range(3))
    valid = torch.arange(T)[None] < T - T // 10
    with torch.no_grad(), CountFusedCalls():
        block_sparse_attention(q, k, v, valid, block_size=L, window=1, global_positions=(0, T // 2))
    total = 2 * T // L
    assert blocks["masked"] + blocks["unmasked"] == total
    assert blocks["masked"] <= 0.15 * total, blocks


@pytest.mark.parametrize("batch, length, block, window, globals_, lengths", MERGED_CASES)
def test_bfloat16_kernel_stays_within_bfloat16_rounding_of_the_float64_reference(
    monkeypatch, golden, batch, length, block, window, globals_, lengths
) -> None:
    # bfloat16 takes its own steps (the log-sum-exp rounded to bfloat16 in the backward,
    # the merge factor rounded to bfloat16): against dense float64 attention on the same
    # bfloat16-rounded inputs, errors stay at bfloat16's level (measured: 2 % of the
    # largest value at most).
    import attnlab.attention.sparse._block_window_kernel as kernel

    monkeypatch.setattr(kernel, "_CHUNK_ELEMENTS", 3 * block * (2 * window + 1) * block)  # several chunks
    *tensors, valid = _merged_inputs(batch, length, lengths, hole=True)
    q, k, v, upstream = (x.to(torch.bfloat16) for x in tensors)
    outputs = []
    for dtype in (torch.bfloat16, torch.float64):
        leaves = [x.to(dtype).clone().requires_grad_(True) for x in (q, k, v)]
        if dtype == torch.bfloat16:
            out = block_sparse_attention(*leaves, valid, block_size=block, window=window,
                                         global_positions=globals_).output
        else:
            out = golden.block_sparse(*leaves, valid, block, window, globals_)
        (out * upstream.to(dtype)).sum().backward()
        outputs.append([x.double() for x in (out.detach(), *(leaf.grad for leaf in leaves))])
    for name, fast, reference in zip(("output", "dq", "dk", "dv"), *outputs):
        assert torch.isfinite(fast).all(), name
        scale = reference.abs().max().clamp(min=1e-3)
        assert (fast - reference).abs().max() / scale < 3e-2, name
