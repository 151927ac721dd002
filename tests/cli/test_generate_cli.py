"""`attnlab generate` (and `inspect` on a decoder), run for real on a tiny random Llama saved at test time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from attnlab.cli import main

transformers = pytest.importorskip("transformers", reason="the tiny model is written with transformers")

WORDS = "<unk> <s> </s> the a cat dog sat on mat and ran away fast slow big small".split()


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("llama")
    tokenizer = Tokenizer(models.WordLevel({word: index for index, word in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    config = transformers.LlamaConfig(vocab_size=len(WORDS), hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def test_generate_prints_the_continuation_and_writes_the_report(llama_dir, tmp_path, capsys):
    out = tmp_path / "report"
    code = main(["generate", "--model", str(llama_dir), "--prompt", "the cat sat on", "--max-new-tokens", "6",
                 "--report", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "report.html" in printed
    generation = json.loads((out / "generation.json").read_text())
    assert generation["prompt_length"] == 4 and 1 <= len(generation["steps"]) <= 6
    assert set(generation["steps"][0]["top_positions"]) == {"layer_1", "layer_2"}
    statistics = json.loads((out / "statistics.json").read_text())
    assert set(statistics) == {"normalized_entropy", "sink_mass", "mean_distance"}
    assert len(statistics["sink_mass"]["layer_1"]) == 4  # one value per head
    assert (out / "generation.html").is_file()
    html = (out / "report.html").read_text()
    assert "attnlab generation report" in html and "cat" in html


def test_sampling_with_a_seed_is_reproducible_from_the_command_line(llama_dir, capsys):
    argv = ["generate", "--model", str(llama_dir), "--prompt", "a dog", "--max-new-tokens", "8", "--sample",
            "--seed", "3", "--top-k", "5"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first


@pytest.mark.needs_cxx
def test_compile_flag_prints_what_the_eager_steps_print(llama_dir, capsys):
    argv = ["generate", "--model", str(llama_dir), "--prompt", "the dog ran", "--max-new-tokens", "6"]
    assert main(argv) == 0
    eager = capsys.readouterr().out
    assert main([*argv, "--compile"]) == 0
    assert capsys.readouterr().out == eager


def test_an_encoder_is_refused_with_a_clear_error(tmp_path, capsys):
    from attnlab import TransformerEncoder

    encoder = TransformerEncoder(len(WORDS), d_model=16, num_layers=1, num_heads=2, d_ff=32)
    tokenizer = Tokenizer(models.WordLevel({word: index for index, word in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    encoder.save_pretrained(tmp_path / "encoder", tokenizer=tokenizer)
    assert main(["generate", "--model", str(tmp_path / "encoder"), "--prompt", "the cat"]) == 2
    assert "encoder holds TransformerEncoder, not a decoder" in capsys.readouterr().err  # was "is a TransformerEncoder"


def test_inspect_accepts_a_decoder(llama_dir, tmp_path):
    out = tmp_path / "inspect"
    assert main(["inspect", "--model", str(llama_dir), "--text", "the big dog ran", "--out", str(out),
                 "--format", "png"]) == 0
    html = (out / "report.html").read_text()
    assert "sink_mass" in html  # causal statistics for a decoder


def test_analyze_accepts_a_decoder(llama_dir, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat on the mat\na dog ran\nthe big small cat ran away fast\n", encoding="utf-8")
    out = tmp_path / "analysis"
    assert main(["analyze", "--model", str(llama_dir), "--data", str(texts), "--out", str(out)]) == 0
    statistics = json.loads((out / "statistics.json").read_text())
    found = json.dumps(statistics)
    assert "sink_mass" in found  # causal statistics for a decoder


def test_a_left_padded_batch_generates_what_each_prompt_generates_alone(llama_dir):
    import attnlab

    model, tokenizer, config = attnlab.load(llama_dir)
    assert config["model_type"] == "llama" and tokenizer.padding_side == "left"
    prompts = ["the cat sat on the mat and", "a dog"]
    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    assert batch["attention_mask"][1, 0] == 0  # padded on the left
    together = model.generate(batch["input_ids"], batch["attention_mask"], max_new_tokens=5, eos_token_id=-1)
    for row, prompt in enumerate(prompts):
        alone = model.generate(tokenizer([prompt], return_tensors="pt")["input_ids"], max_new_tokens=5,
                               eos_token_id=-1)
        assert together.sequences[row, -5:].tolist() == alone.sequences[0, -5:].tolist()


def test_every_entry_point_opens_the_decoder(llama_dir):
    from attnlab.models.decoder import DecoderForCausalLM
    from attnlab.checkpoints.encoders.loading import from_pretrained

    assert isinstance(DecoderForCausalLM.from_pretrained(llama_dir), DecoderForCausalLM)
    assert isinstance(from_pretrained(str(llama_dir)), DecoderForCausalLM)
    with pytest.raises(TypeError, match="not a TransformerEncoder"):
        __import__("attnlab").TransformerEncoder.from_pretrained(llama_dir)


def test_explain_on_a_decoder_reads_the_last_tokens_attention(llama_dir, tmp_path, capsys):
    # Regression: a decoder was explained at row 0 (which sees only itself): [1, 0, 0, ...].
    out = tmp_path / "explained"
    assert main(["explain", "--model", str(llama_dir), "--text", "the cat sat on", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "last token" in printed
    explanation = json.loads((out / "explanation.json").read_text())
    assert "last token" in explanation["explained_position"] and "'on'" in explanation["explained_position"]
    for method in ("raw", "rollout", "flow"):
        scores = explanation["scores"][method]
        assert scores[0] < 0.99 and sum(value > 0 for value in scores) == len(scores), (method, scores)


def test_every_model_command_takes_a_gguf_file_as_attnlab_load_does(tiny_gguf, tmp_path, capsys):
    # Regression: --model file.gguf was refused ("must be a run/checkpoint directory or a pretrained name").
    assert main(["generate", "--model", str(tiny_gguf), "--prompt", "ab abc", "--max-new-tokens", "3"]) == 0
    assert main(["inspect", "--model", str(tiny_gguf), "--text", "ab abc", "--out", str(tmp_path / "seen"),
                 "--format", "png"]) == 0
    assert (tmp_path / "seen" / "report.html").is_file()
    capsys.readouterr()
    (tmp_path / "notes.txt").write_text("not a model\n")
    try:
        code = main(["generate", "--model", str(tmp_path / "notes.txt"), "--prompt", "ab"])
    except SystemExit as stop:
        code = stop.code
    assert code == 2 and ".gguf" in capsys.readouterr().err


def test_a_decoders_pictures_and_report_show_the_tokens_text(tiny_gguf, tmp_path):
    # Regression: the ticks and the report showed byte-level BPE's vocabulary strings ("Ġab").
    from attnlab import load
    from attnlab.inspect.commands.inspect_text import write_inspection

    loaded = load(tiny_gguf)
    text = "ab abc a ab"
    inspection = write_inspection(loaded.model, loaded.tokenizer, text, tmp_path / "seen", formats=("svg",))
    raw = loaded.tokenizer.encode(text).tokens
    assert any("\u0120" in token for token in raw)  # the vocabulary's strings carry Ġ for a space
    assert not any("\u0120" in token for token in inspection.tokens)
    assert "".join(inspection.tokens).replace("\u2423", " ") == text  # each token's own text; a bare space: ␣
    head = (tmp_path / "seen" / "head_L2_H1.svg").read_text(encoding="utf-8")
    assert "\u0120" not in head and "\u0120" not in (tmp_path / "seen" / "report.html").read_text(encoding="utf-8")


def test_dtype_flag_chooses_the_weights_dtype_and_the_command_says_which(llama_dir, capsys):
    assert main(["generate", "--model", str(llama_dir), "--prompt", "the cat", "--max-new-tokens", "2"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"dtype: float32 for {llama_dir} (the default; --dtype to change)"
    assert main(["generate", "--model", str(llama_dir), "--prompt", "the cat", "--max-new-tokens", "2",
                 "--dtype", "bfloat16"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"dtype: bfloat16 for {llama_dir} (--dtype)"
    assert main(["generate", "--model", str(llama_dir), "--prompt", "the cat", "--max-new-tokens", "2",
                 "--dtype", "auto"]) == 0  # the file is float32
    assert capsys.readouterr().out.splitlines()[0] == (
        f"dtype: float32 for {llama_dir} (--dtype auto: the checkpoint's own)")


def test_verbose_says_how_the_decoding_steps_ran(llama_dir, tmp_path, capsys):
    """A Qwen3 directory opens through transformers: the native step serves its greedy
    generation; a report asks for weights, so transformers' generate runs, and says why."""
    directory = tmp_path / "qwen3"
    config = transformers.Qwen3Config(vocab_size=len(WORDS), hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=8, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(directory)
    (directory / "tokenizer.json").write_text((llama_dir / "tokenizer.json").read_text())
    argv = ["generate", "--model", str(directory), "--prompt", "the cat sat on", "--max-new-tokens", "4",
            "--verbose"]
    assert main(argv) == 0
    assert "decoding: attnlab's native decoding step" in capsys.readouterr().out
    assert main([*argv, "--report", str(tmp_path / "report")]) == 0
    assert "decoding: transformers' generate (the weights are asked for" in capsys.readouterr().out
