"""The real Gemma 3 270M, opened from its GGUF file through transformers' GGUF reader and
served by attnlab's attention function: its weights equal transformers' eager ones, and it
does what a trained language model does where a random model of the same config does not
(heads with roles, copying a repeated sequence, a logit lens that finds the answer in the
later layers, explanations that point at the copied token). Its local layers put exactly
nothing beyond their sliding window of 512 tokens; its global layers do."""

from __future__ import annotations

import json
import random

import pytest
import torch

from attnlab.inspect.compute.head_roles import find_head_roles
from attnlab.inspect.compute.logit_lens import logit_lens
from attnlab.workflows.explain_generation import explain_generation
from gemma_fixture import random_gemma

PROMPT = "The secret code is zebra-4471. I repeat, the secret code is zebra-"
SPECIAL = (0, 1, 2, 3, 106)  # <pad>, <eos>, <bos>, <unk>, <start_of_turn>: left out of the random tokens


@pytest.fixture(scope="module")
def gemma3_from_dir(gemma3_dir):
    import attnlab

    return attnlab.load(gemma3_dir)


@pytest.fixture(scope="module")
def random_model(gemma3):
    return random_gemma(gemma3.model)


def test_the_gguf_file_opens_through_transformers_with_eager_weights(gemma3, gemma3_dir):
    import transformers

    model, tokenizer, _ = gemma3
    assert type(model).__name__ == "TransformersModel" and model.architecture == "Gemma3ForCausalLM"
    ids = tokenizer([PROMPT], return_tensors="pt")["input_ids"]
    assert ids[0, 0].item() == 2  # Gemma's tokenizer adds <bos>
    with torch.no_grad(), model.record() as seen:
        logits = model(ids).logits
    eager = transformers.AutoModelForCausalLM.from_pretrained(gemma3_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        reference = eager(ids, output_attentions=True)
    assert torch.allclose(logits, reference.logits, atol=1e-3, rtol=1e-4)
    assert len(seen.attentions) == 18
    for ours, theirs in zip(seen.attentions.values(), reference.attentions):
        assert torch.allclose(ours, theirs, atol=1e-5)


def test_head_roles_and_copying_a_repeated_sequence(gemma3_from_dir, random_model):
    real = find_head_roles(gemma3_from_dir.model, length=50, seed=0, bos_id=2, exclude=SPECIAL)
    chance = find_head_roles(random_model, length=50, seed=0, bos_id=2, exclude=SPECIAL)
    for roles, trained in ((real, True), (chance, False)):
        best = {role: roles.strongest(role, 1)[0][2] for role in ("previous-token", "induction", "first-token")}
        losses = roles.repeated_tokens
        print("trained" if trained else "random", best, losses)
        copies = losses.second_copy < 0.25 * losses.first_copy
        heads = best["induction"] > 0.6 and best["previous-token"] > 0.5 and best["first-token"] > 0.9
        assert copies == trained and heads == trained


def test_the_logit_lens_finds_the_copied_token_only_in_later_layers(gemma3_from_dir, random_model):
    ids = find_head_roles(gemma3_from_dir.model, length=50, seed=0, bos_id=2, exclude=SPECIAL).input_ids
    second_copy = torch.arange(51, 100)  # each predicts the next token of the repeated sequence
    for model, trained in ((gemma3_from_dir.model, True), (random_model, False)):
        lens = logit_lens(model, ids, positions=second_copy)
        accuracy = (lens.target_ranks == 1).double().mean(-1)  # [L + 1]: embeddings, layer_1 .. layer_18
        print("trained" if trained else "random", [round(value, 2) for value in accuracy.tolist()])
        assert (accuracy[-1] > 0.6).item() == trained
        assert accuracy[:4].max() < 0.1  # the embeddings and first layers know nothing of the copy


def test_the_explanation_of_a_copied_code_points_at_its_first_copy(gemma3_from_dir, random_model):
    tokenizer = gemma3_from_dir.tokenizer
    for model, trained in ((gemma3_from_dir.model, True), (random_model, False)):
        explanation = explain_generation(model, tokenizer, PROMPT, ["occlusion"], continuation="4", lens=False)[0]
        assert explanation.tokens[-1] == "4" and "<bos>" not in explanation.tokens[1:]
        scores = torch.tensor(explanation.scores["occlusion"][0][:explanation.prompt_length])
        first_code = explanation.tokens.index("4")  # the token after the first "zebra-"
        print("trained" if trained else "random", explanation.tokens[int(scores.argmax())], scores.tolist())
        assert (int(scores.argmax()) == first_code and scores[first_code] > 2 * scores[first_code + 1:].max()) \
            == trained


def test_heads_and_explain_on_the_command_line(gemma3_dir, tmp_path, capsys):
    from attnlab.cli import main

    assert main(["heads", "--model", str(gemma3_dir), "--out", str(tmp_path / "heads")]) == 0
    heads = json.loads((tmp_path / "heads" / "heads.json").read_text())
    assert heads["strongest"]["induction"][0]["score"] > 0.6
    assert heads["repeated_tokens"]["second_copy"] < 0.25 * heads["repeated_tokens"]["first_copy"]
    assert main(["explain", "--model", str(gemma3_dir), "--prompt", PROMPT, "--max-new-tokens", "2",
                 "--method", "occlusion", "--out", str(tmp_path / "explain")]) == 0
    explanation = json.loads((tmp_path / "explain" / "explanation.json").read_text())
    print(json.dumps(explanation)[:400])
    printed = capsys.readouterr().out
    assert "logit lens" in printed and "occlusion: first token's strongest source '4'" in printed


def test_local_layers_put_nothing_beyond_the_window_and_global_layers_do(gemma3_dir, tmp_path, capsys):
    from attnlab.cli import main

    words = "the cat river mountain quiet storm light ancient city people walked narrow streets bread".split()
    pick = random.Random(0)
    (tmp_path / "long.txt").write_text(" ".join(pick.choice(words) for _ in range(640)) + "\n")
    assert main(["analyze", "--model", str(gemma3_dir), "--data", str(tmp_path / "long.txt"),
                 "--out", str(tmp_path / "analysis"), "--no-progress"]) == 0
    statistics = json.loads((tmp_path / "analysis" / "statistics.json").read_text())
    assert statistics["settings"]["sliding_window"] == 512 and statistics["tokens"] > 512
    beyond = statistics["statistics"]["beyond_window"]
    global_layers = {"layer_6", "layer_12", "layer_18"}  # every sixth layer of Gemma 3 attends globally
    for layer, heads in beyond.items():
        if layer in global_layers:
            assert min(heads) > 0.01, (layer, heads)
        else:
            assert heads == [0.0] * 4, (layer, heads)  # exactly: the window's mask, not a small number
    assert ("sliding window 512 tokens: layers 1-5, 7-11, 13-17 put exactly 0 beyond it; layers 6, 12, 18 put"
            in capsys.readouterr().out)


def test_greedy_tokens_through_the_native_step_are_transformers_generate_s(gemma3_from_dir, gemma3_dir):
    """Gemma 3's four norms per layer, query/key norms, scaled embeddings and sliding layers
    with their own rotary angles, in attnlab's native decoding step: transformers' own tokens."""
    import transformers

    model, tokenizer, _ = gemma3_from_dir
    assert model.unserved_reason(1, do_sample=False) is None
    reference = transformers.AutoModelForCausalLM.from_pretrained(gemma3_dir, attn_implementation="eager")
    reference.eval()
    ids = torch.tensor([tokenizer.encode(PROMPT).ids])
    with torch.no_grad():
        expected = reference.generate(input_ids=ids, max_new_tokens=16, do_sample=False)
    ours = model.generate(ids, max_new_tokens=16, do_sample=False, output_attentions=False)
    assert ours.attentions is None and torch.equal(ours.sequences, expected)


def test_in_bfloat16_the_native_step_picks_float64_s_tokens_where_they_clearly_lead(gemma3_dir):
    """The checkpoint's own dtype: matrices and cache in bfloat16, the step in float32. Each
    new token is the argmax of a float64 forward of the same bfloat16 weights wherever that
    argmax leads by more than twice transformers' own bfloat16 forward's error."""
    import copy

    import attnlab

    model, tokenizer, _ = attnlab.load(gemma3_dir, dtype="bfloat16")
    assert model.unserved_reason(1, do_sample=False) is None
    ids = torch.tensor([tokenizer.encode(PROMPT).ids])
    out = model.generate(ids, max_new_tokens=16, do_sample=False, output_attentions=False)
    inner = model.model
    assert inner.lm_head.weight.dtype == torch.bfloat16
    with torch.no_grad():
        own = inner(out.sequences).logits[0, -17:-1].double()  # [16, V]: the logits that chose each token
        exact = copy.deepcopy(inner).double()(out.sequences).logits[0, -17:-1]
    tolerance = (own - exact).abs().amax(-1)
    chosen = out.sequences[0, -16:]
    clear = exact.topk(2, dim=-1).values.diff(dim=-1)[..., 0].abs() > 2 * tolerance
    assert int(clear.sum()) >= 8  # the premise: most steps are clear
    assert (chosen[clear] == exact.argmax(-1)[clear]).all()
