"""Attention statistics against values computed by hand on crafted maps."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.inspect import AttentionAnalyzer, HeadStatistics, row_statistics
from attnlab.inspect.compute.statistics import neighbour_alignment


def _one_layer(weights, mask, **options):
    stats = HeadStatistics(**options)
    stats.update("layer_1", weights, mask, mask, input_ids=options.pop("ids", None))
    return stats.means()["layer_1"]


def test_uniform_rows_over_real_keys():
    # one example, T = 6 with 4 real tokens; real rows uniform over the 4 real keys,
    # padded rows and padded keys filled with garbage that must be ignored
    T, n = 6, 4
    weights = torch.full((1, 1, T, T), 0.37)
    weights[0, 0, :n, :n] = 1.0 / n
    weights[0, 0, :n, n:] = 0.0
    mask = torch.tensor([[True] * n + [False] * (T - n)])
    means = _one_layer(weights, mask, sparsity_threshold=0.3, top_k=3)
    assert means["entropy"][0] == pytest.approx(math.log(n))
    assert means["normalized_entropy"][0] == pytest.approx(1.0)
    assert means["sparsity"][0] == pytest.approx(1.0)  # 0.25 < 0.3 everywhere
    assert means["top_k_mass"][0] == pytest.approx(0.75)
    assert means["gini"][0] == pytest.approx(0.0, abs=1e-6)
    # mean offset of row t is mean(s) - t = 1.5 - t, averaged over t = 0..3 -> 0
    assert means["mean_offset"][0] == pytest.approx(0.0, abs=1e-6)
    # mean distance of row t: mean |s - t| over s in 0..3: rows give 1.5, 1, 1, 1.5
    assert means["mean_distance"][0] == pytest.approx(1.25)
    # neighbour band has 1 key in rows 0 and 3 and 2 keys in rows 1 and 2: (1+2+2+1)/4/4
    assert means["alignment_score"][0] == pytest.approx(6 / 16)


def test_one_hot_rows():
    n = 5
    weights = torch.zeros(1, 1, n, n)
    for t in range(n):
        weights[0, 0, t, max(t - 1, 0)] = 1.0  # attend to the previous token (row 0 to itself)
    mask = torch.ones(1, n, dtype=torch.bool)
    means = _one_layer(weights, mask, sparsity_threshold=0.1, top_k=2)
    assert means["entropy"][0] == pytest.approx(0.0, abs=1e-7)
    assert means["normalized_entropy"][0] == pytest.approx(0.0, abs=1e-7)
    assert means["sparsity"][0] == pytest.approx((n - 1) / n)
    assert means["top_k_mass"][0] == pytest.approx(1.0)
    assert means["gini"][0] == pytest.approx((n - 1) / n)
    assert means["mean_offset"][0] == pytest.approx(-(n - 1) / n)
    # rows 1..4 hit their previous token (a reference key); row 0 attends to itself
    assert means["alignment_score"][0] == pytest.approx((n - 1) / n)
    assert means["alignment_argmax"][0] == pytest.approx((n - 1) / n)


def test_banded_rows_match_the_default_reference():
    n = 6
    weights = torch.zeros(1, 2, n, n)
    for t in range(n):
        neighbours = [s for s in (t - 1, t + 1) if 0 <= s < n]
        for s in neighbours:
            weights[0, 0, t, s] = 1.0 / len(neighbours)
    weights[0, 1] = torch.eye(n)  # head 2 looks at itself only: never on the band
    mask = torch.ones(1, n, dtype=torch.bool)
    means = _one_layer(weights, mask)
    assert means["alignment_score"] == pytest.approx([1.0, 0.0])
    assert means["alignment_argmax"] == pytest.approx([1.0, 0.0])
    assert means["mean_distance"] == pytest.approx([1.0, 0.0])
    # interior rows entropy log 2, the two end rows 0
    assert means["entropy"][0] == pytest.approx((n - 2) * math.log(2) / n)


def test_hand_computed_row():
    weights = torch.tensor([0.5, 0.3, 0.2]).view(1, 1, 1, 3)
    mask_q = torch.ones(1, 1, dtype=torch.bool)
    mask_k = torch.ones(1, 3, dtype=torch.bool)
    values, rows = row_statistics(weights, mask_q, mask_k, sparsity_threshold=0.25, top_k=2)
    assert rows["entropy"].all()
    entropy = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2))
    assert values["entropy"].item() == pytest.approx(entropy, rel=1e-6)
    assert values["normalized_entropy"].item() == pytest.approx(entropy / math.log(3), rel=1e-6)
    assert values["sparsity"].item() == pytest.approx(1 / 3)
    assert values["top_k_mass"].item() == pytest.approx(0.8)
    # mean absolute difference / (2 * mean): (2 * (0.2 + 0.3 + 0.1)) / (2 * 9 * (1/3)) = 0.2
    assert values["gini"].item() == pytest.approx(0.2, rel=1e-6)
    assert values["mean_offset"].item() == pytest.approx(0.3 + 0.4)  # query at t = 0


def test_padding_is_excluded_and_rows_renormalised():
    # the same 3-token example alone and padded to 5 with mass leaking onto padded keys
    torch.manual_seed(0)
    real = torch.softmax(torch.randn(1, 2, 3, 3), -1)
    padded = torch.rand(1, 2, 5, 5)
    padded[:, :, :3, :3] = real * 0.8  # 20 % of each real row sits on padded keys
    padded[:, :, :3, 3:] = 0.1
    alone = _one_layer(real, torch.ones(1, 3, dtype=torch.bool))
    with_padding = _one_layer(padded, torch.tensor([[True, True, True, False, False]]))
    for name in alone:
        assert with_padding[name] == pytest.approx(alone[name], rel=1e-5, abs=1e-6), name


def test_custom_alignment_and_token_groups():
    ids = torch.tensor([[2, 7, 4, 8, 3]])  # [CLS] w , w [SEP]
    weights = torch.zeros(1, 1, 5, 5)
    weights[0, 0, :, 0] = 0.5  # half on [CLS]
    weights[0, 0, :, 2] = 0.25  # a quarter on the comma
    weights[0, 0, :, 4] = 0.25  # a quarter on [SEP]
    alignment = torch.zeros(1, 5, 5, dtype=torch.bool)
    alignment[0, :, 0] = True
    mask = torch.ones(1, 5, dtype=torch.bool)
    stats = HeadStatistics(token_groups={"cls": [2], "sep": [3], "punct": [4]})
    stats.update("layer_1", weights, mask, mask, alignment=alignment, input_ids=ids)
    means = stats.means()["layer_1"]
    assert means["mass_cls"] == pytest.approx([0.5])
    assert means["mass_sep"] == pytest.approx([0.25])
    assert means["mass_punct"] == pytest.approx([0.25])
    assert means["alignment_score"] == pytest.approx([0.5])
    assert means["alignment_argmax"] == pytest.approx([1.0])


def test_neighbour_alignment_is_the_band():
    band = neighbour_alignment(4, 4)
    expected = torch.tensor([[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1], [0, 0, 1, 0]], dtype=torch.bool)
    assert torch.equal(band, expected)


@pytest.mark.parametrize("threshold", [0.0, 1.5, "0.1", True])
def test_bad_threshold_is_rejected(threshold):
    with pytest.raises(ValueError, match="sparsity_threshold"):
        HeadStatistics(sparsity_threshold=threshold)


def _padded(examples, pad_id=0):
    T = max(len(example) for example in examples)
    ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    for row, example in enumerate(examples):
        ids[row, : len(example)] = torch.tensor(example)
    return ids


def test_streaming_equals_all_at_once(encoder):
    torch.manual_seed(1)
    examples = [torch.randint(1, 20, (length,)).tolist() for length in (3, 9, 5, 12, 1, 7, 7, 2)]
    analyzer = AttentionAnalyzer(encoder, token_groups={"cls": [2]})
    one_by_one = analyzer.analyze_attention_distribution([(_padded([example]),) for example in examples])
    everything = analyzer.analyze_attention_distribution([_padded(examples)])
    in_pairs = analyzer.analyze_attention_distribution(
        [
            {"input_ids": _padded(examples[i : i + 2]), "mask": _padded(examples[i : i + 2]) != 0}
            for i in range(0, len(examples), 2)
        ]
    )
    assert one_by_one.examples == everything.examples == in_pairs.examples == len(examples)
    assert one_by_one.rows == everything.rows == in_pairs.rows
    for name in everything.keys():
        expected = everything.matrix(name)
        assert one_by_one.matrix(name) == pytest.approx(expected, rel=1e-5, abs=1e-6), name
        assert in_pairs.matrix(name) == pytest.approx(expected, rel=1e-5, abs=1e-6), name
    for layer, values in everything.rollout.items():
        assert one_by_one.rollout[layer]["entropy"] == pytest.approx(values["entropy"], rel=1e-5)
        assert one_by_one.rollout[layer]["self"] == pytest.approx(values["self"], rel=1e-5)


def test_article_call_and_result_access(encoder):
    ids = _padded([[5, 6, 7], [8, 9, 10, 11, 12]])
    stats = AttentionAnalyzer(encoder).analyze_attention_distribution([(ids, torch.tensor([0, 1]))])
    assert len(stats["entropy"]) == 2 and len(stats["entropy"][0]) == 4
    assert stats.tokens == 8  # padding found from the model's pad_id
    assert stats.rows["layer_1"] == [8] * 4
    assert set(stats.to_dict()) >= {"statistics", "layers", "rollout", "settings"}
    assert encoder.training is False


def test_the_result_is_mapping_like(encoder):
    # Regression: `"entropy" in stats` raised KeyError("unknown statistic 0") through __getitem__.
    stats = AttentionAnalyzer(encoder).analyze_attention_distribution([_padded([[5, 6, 7]])])
    assert "entropy" in stats and "alignment_score" in stats and "nonsense" not in stats
    assert list(stats) == stats.keys() and len(stats) == len(stats.statistics) > 0
    assert dict(stats.items()) == {name: stats[name] for name in stats}
    assert stats.values()[0] == stats[stats.keys()[0]]
    assert stats.get("nonsense") is None and stats.get("entropy") == stats["entropy"]
    with pytest.raises(KeyError, match="unknown statistic 'nonsense'"):
        stats["nonsense"]


@pytest.mark.parametrize("T, S", [(5, 5), (4, 7), (7, 4)])
def test_default_band_equals_the_explicit_reference(T, S):
    torch.manual_seed(T * 10 + S)
    weights = torch.softmax(torch.randn(2, 3, T, S), -1)
    query_mask = torch.ones(2, T, dtype=torch.bool)
    key_mask = torch.rand(2, S) > 0.3
    key_mask[:, 0] = True
    default, _ = row_statistics(weights, query_mask, key_mask)
    explicit, _ = row_statistics(weights, query_mask, key_mask, alignment=neighbour_alignment(T, S))
    assert torch.allclose(default["alignment_score"], explicit["alignment_score"], atol=1e-6)
    assert torch.equal(default["alignment_argmax"], explicit["alignment_argmax"])


@pytest.mark.parametrize("chunk_cells", [1, 4 * 7 * 3, 4 * 7 * 7 * 3])
def test_chunked_statistics_equal_one_pass(chunk_cells):
    # blocks of 1 and of 3 query rows, blocks of 3 examples, against one pass
    torch.manual_seed(2)
    L, B, H, T = 2, 5, 4, 7
    weights = torch.softmax(torch.randn(L, B, H, T, T), -1)
    mask = torch.rand(B, T) > 0.3
    mask[:, 0] = True
    weights = weights * mask[None, :, None, None, :]
    alignment = torch.rand(B, T, T) > 0.7
    ids = torch.randint(0, 5, (B, T))
    results = []
    for cells in (chunk_cells, 1 << 20):
        stats = HeadStatistics(token_groups={"low": [0, 1]}, chunk_cells=cells)
        stats.update(["layer_1", "layer_2"], weights, mask, mask, input_ids=ids)
        stats.update(["layer_1", "layer_2"], weights, mask, mask, alignment=alignment, input_ids=ids)
        results.append((stats.means(), stats.row_counts()))
    (chunked, chunked_rows), (whole, whole_rows) = results
    assert chunked_rows == whole_rows
    for layer in whole:
        for name, values in whole[layer].items():
            assert chunked[layer][name] == pytest.approx(values, rel=1e-5, abs=1e-6), (layer, name)
