"""`attnlab explain --prompt` and `attnlab heads` on tiny decoders saved by transformers at test time
(Llama, GPT-2, Qwen2, Mistral, a GGUF file, and a model opened through transformers)."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from attnlab.cli import main

transformers = pytest.importorskip("transformers", reason="the tiny models are written with transformers")

WORDS = "<unk> <s> </s> the a cat dog sat on mat and ran away fast slow big small Paris London is".split()


def _save(directory: Path, kind: str) -> Path:
    tokenizer = Tokenizer(models.WordLevel({word: index for index, word in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    common = dict(vocab_size=len(WORDS), bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    if kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=16,
                                                                     **common))
    else:
        classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                   "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                   "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
                   "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}
        config_class, model_class = classes[kind]
        model = model_class(config_class(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                         head_dim=8, **common))
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return _save(tmp_path_factory.mktemp("llama"), "llama")


def test_explain_a_generation_writes_json_png_and_page(llama_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["explain", "--model", str(llama_dir), "--prompt", "the cat sat on", "--max-new-tokens", "3",
                 "--steps", "4", "--method", "all", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "logit lens" in printed and "layer_2" in printed
    result = json.loads((out / "explanation.json").read_text())
    (prompt,) = result["prompts"]
    assert prompt["prompt_length"] == 4 and len(prompt["generated"]) >= 1
    assert prompt["methods"] == ["raw", "rollout", "grad-attention", "integrated-gradients", "occlusion", "attn-lrp"]
    first = prompt["scores"]["occlusion"][0]
    assert len(first) == 4  # the first generated token sees the 4 prompt tokens
    assert len(prompt["logit_lens"]["layers"]) == 3
    for name in ("explanation.png", "logit_lens.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    page = (out / "explanation.html").read_text()
    assert "http" not in page.split("<body>")[1].replace("http://www.w3.org", "")  # nothing fetched


def test_a_contrastive_question_and_several_prompts(llama_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["explain", "--model", str(llama_dir), "--prompt", "the cat is", "a dog is", "--target", "Paris",
                 "--foil", "London", "--method", "occlusion", "raw", "--out", str(out)]) == 0
    result = json.loads((out / "explanation.json").read_text())
    assert len(result["prompts"]) == 2
    assert all(p["generated"] == ["Paris"] and p["foil"] == "London" for p in result["prompts"])
    assert result["prompts"][0]["objective_name"] == "log p(target) - log p(foil)"
    assert (out / "explanation-2.html").is_file() and (out / "explanation-2.png").is_file()


def test_a_given_continuation_is_explained_token_by_token(llama_dir, tmp_path):
    out = tmp_path / "out"
    assert main(["explain", "--model", str(llama_dir), "--prompt", "the cat", "--continuation", "sat on the mat",
                 "--method", "raw", "rollout", "--out", str(out)]) == 0
    prompt = json.loads((out / "explanation.json").read_text())["prompts"][0]
    assert prompt["generated"] == ["sat", "on", "the", "mat"]
    assert [len(row) for row in prompt["scores"]["raw"]] == [2, 3, 4, 5]


def test_the_baseline_and_each_tokens_completeness_gap_are_reported(llama_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["explain", "--model", str(llama_dir), "--prompt", "the cat", "--continuation", "sat on",
                 "--method", "integrated-gradients", "--baseline", "mean", "--steps", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    prompt = json.loads((out / "explanation.json").read_text())["prompts"][0]
    assert prompt["integrated_gradients_baseline"] == "mean" and prompt["integrated_gradients_steps"] == 2
    gaps = prompt["integrated_gradients_completeness_gaps"]
    assert len(gaps) == 2 and max(gaps) == pytest.approx(prompt["integrated_gradients_completeness_gap"])
    assert prompt["integrated_gradients_note"] in printed
    assert prompt["integrated_gradients_complete"] == (max(gaps) <= 0.05)
    assert html.escape(prompt["integrated_gradients_note"]) in (out / "explanation.html").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "the cat " * 15], "--prompt 'the cat the cat"),
    (["--prompt", "the cat", "--foil", "big dog"], "--foil 'big dog' is 2 tokens"),
    (["--prompt", "the cat", "--continuation", "sat", "--target", "dog"], "--continuation or --target"),
    (["--prompt", "the cat", "--method", "flow"], "--method flow is not a method for generated text"),
    (["--text", "the cat", "--method", "occlusion"], "--method occlusion explains generated text"),
    (["--text", "the cat", "--prompt", "a dog"], "give --text"),
    (["--prompt", "the cat", "--baseline", "average"], "--baseline must be one of pad, zero, mean"),
])
def test_bad_requests_are_refused_in_one_line_before_anything_is_written(llama_dir, tmp_path, capsys, argv,
                                                                         message):
    out = tmp_path / "out"
    assert main(["explain", "--model", str(llama_dir), *argv, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1
    assert not (out / "explanation.json").exists()


@pytest.mark.parametrize("kind", ["gpt2", "qwen2", "mistral"])
def test_every_decoder_family_is_explained(kind, tmp_path):
    (tmp_path / kind).mkdir()
    directory = _save(tmp_path / kind, kind)
    out = tmp_path / "out"
    assert main(["explain", "--model", str(directory), "--prompt", "the cat sat", "--max-new-tokens", "2",
                 "--steps", "2", "--method", "all", "--out", str(out)]) == 0
    assert json.loads((out / "explanation.json").read_text())["prompts"][0]["scores"]["integrated-gradients"]


def test_a_gguf_file_is_explained_and_its_heads_scored(tiny_gguf, tmp_path):
    assert main(["explain", "--model", str(tiny_gguf), "--prompt", "abc ab", "--max-new-tokens", "2",
                 "--steps", "2", "--out", str(tmp_path / "explain")]) == 0
    assert main(["heads", "--model", str(tiny_gguf), "--length", "10", "--out", str(tmp_path / "heads")]) == 0


def test_a_model_opened_through_transformers_gets_every_method_and_the_lens(tmp_path):
    directory = _save(tmp_path, "qwen3")  # a family attnlab does not re-implement
    out = tmp_path / "out"
    assert main(["explain", "--model", str(directory), "--prompt", "the cat sat", "--max-new-tokens", "2",
                 "--steps", "2", "--method", "all", "--out", str(out)]) == 0
    prompt = json.loads((out / "explanation.json").read_text())["prompts"][0]
    assert set(prompt["methods"]) == {"raw", "rollout", "grad-attention", "integrated-gradients", "occlusion", "attn-lrp"}
    assert len(prompt["logit_lens"]["layers"]) == 3


def test_heads_writes_scores_and_a_picture_per_role(llama_dir, tmp_path, capsys):
    out = tmp_path / "heads"
    assert main(["heads", "--model", str(llama_dir), "--length", "6", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "repeated random tokens" in printed and "induction" in printed
    result = json.loads((out / "heads.json").read_text())
    assert set(result["scores"]) == {"previous-token", "duplicate-token", "induction", "first-token"}
    assert len(result["scores"]["induction"]) == 2 and len(result["scores"]["induction"][0]) == 4
    assert result["repeated_tokens"]["first_copy"] > 0
    for role in result["scores"]:
        assert (out / f"heads-{role}.png").read_bytes()[:4] == b"\x89PNG"


def test_without_method_the_most_faithful_measured_one_runs_and_the_page_marks_the_rest(
        llama_dir, tmp_path, capsys, measured_faithfulness, chromium):
    measured_faithfulness("decoder", "llama", {"occlusion": 5.0, "raw": 1.05, "rollout": 3.0})
    out = tmp_path / "default"
    assert main(["explain", "--model", str(llama_dir), "--prompt", "the cat sat", "--max-new-tokens", "2",
                 "--out", str(out)]) == 0
    assert "method: occlusion, ranked most faithful" in capsys.readouterr().out
    assert json.loads((out / "explanation.json").read_text())["prompts"][0]["methods"] == ["occlusion"]

    out = tmp_path / "chosen"
    assert main(["explain", "--model", str(llama_dir), "--prompt", "the cat sat", "--max-new-tokens", "2",
                 "--method", "raw", "rollout", "--out", str(out)]) == 0
    measured = json.loads((out / "explanation.json").read_text())["prompts"][0]["faithfulness"]
    assert measured["measured_on"] == "a measured llama" and measured["same_family"] is True
    assert measured["methods"]["raw"]["at_or_below_random"] is True
    assert measured["methods"]["rollout"]["at_or_below_random"] is False
    page = chromium.new_page()
    page.goto((out / "explanation.html").resolve().as_uri())
    marked = page.locator('.method[data-method="raw"] .faithfulness.below-random')
    assert "measured at or below random" in marked.inner_text()
    assert page.locator('.method[data-method="rollout"] .faithfulness.below-random').count() == 0
    assert "above random" in page.locator('.method[data-method="rollout"] .faithfulness').inner_text()
    page.close()
