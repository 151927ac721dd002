"""Commands against kinds of model they do not take, and damaged or mismatched transformers
directories: one line naming what was wrong and what to do, exit 2, no traceback, nothing
written. Each case was a traceback or a silently wrong answer before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers directories need the hf extra")

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

from attnlab.cli import main  # noqa: E402


def _tokenizer(directory: Path, size: int, reverse: bool = False) -> None:
    vocabulary = {"[UNK]": 0, **{f"w{i}": size - i if reverse else i for i in range(1, size)}}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kinds")
    torch.manual_seed(0)
    qwen3 = transformers.Qwen3Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                     max_position_embeddings=64)
    transformers.Qwen3ForCausalLM(qwen3).save_pretrained(root / "qwen3")
    _tokenizer(root / "qwen3", 40)
    shutil.copytree(root / "qwen3", root / "other_tokenizer")
    _tokenizer(root / "other_tokenizer", 80)  # ids up to 79 for a vocabulary of 40
    shutil.copytree(root / "qwen3", root / "reversed_tokenizer")
    _tokenizer(root / "reversed_tokenizer", 40, reverse=True)
    shutil.copytree(root / "qwen3", root / "truncated")
    weights = (root / "truncated" / "model.safetensors").read_bytes()
    (root / "truncated" / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    shutil.copytree(root / "qwen3", root / "mismatched")
    config = json.loads((root / "mismatched" / "config.json").read_text())
    (root / "mismatched" / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    bart = transformers.BartConfig(vocab_size=40, d_model=32, encoder_layers=2, decoder_layers=2,
                                   encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                   decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2, decoder_start_token_id=1)
    transformers.BartForConditionalGeneration(bart).save_pretrained(root / "bart")
    _tokenizer(root / "bart", 40)
    whisper = transformers.WhisperConfig(vocab_size=40, d_model=32, encoder_layers=1, decoder_layers=1,
                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                         decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=4,
                                         max_target_positions=16, pad_token_id=0, decoder_start_token_id=1)
    transformers.WhisperForConditionalGeneration(whisper).save_pretrained(root / "whisper")
    _tokenizer(root / "whisper", 40)
    vit = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1,
                                 num_attention_heads=4, intermediate_size=64, num_labels=2)
    transformers.ViTForImageClassification(vit).save_pretrained(root / "vit")
    return root


def _one_line_error(argv: list, capsys) -> str:
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    progress = "Loading weights"  # transformers' own progress bar while it reads the weights
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and progress not in line]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, f"{argv} -> exit {code}, stderr {err!r}"
    return lines[0]


@pytest.mark.parametrize("argv, expected", [
    # an encoder-decoder given one text: its encoder, decoder and cross maps shared one token axis
    (["inspect", "--model", "{bart}", "--text", "w1 w2 w3", "--out", "{out}"], "give --source (and --target)"),
    (["explain", "--model", "{bart}", "--text", "w1 w2 w3", "--out", "{out}"], "inspect --source/--target"),
    (["explain", "--model", "{bart}", "--prompt", "w1 w2", "--out", "{out}"], "inspect --source/--target"),
    (["heads", "--model", "{bart}", "--out", "{out}"], "is an encoder-decoder model"),
    # heads on an encoder: an AttributeError about logits
    (["heads", "--model", "minilm", "--out", "{out}"], "heads needs a decoder"),
    # a tokenizer whose ids pass the model's vocabulary: IndexError
    (["generate", "--model", "{other_tokenizer}", "--prompt", "w70 w2", "--max-new-tokens", "2"],
     "token id 70 lies outside"),
    (["generate", "--model", "{other_tokenizer}", "--prompt", "w70 w2", "--max-new-tokens", "2", "--report",
      "{out}"], "its tokenizer and its model differ"),
    (["inspect", "--model", "{other_tokenizer}", "--text", "w1 w70", "--out", "{out}"], "vocabulary of 40"),
    # a transformers decoder had no context check: it set out to generate them all
    (["generate", "--model", "{qwen3}", "--prompt", "w1", "--max-new-tokens", "1000000000"],
     "context of 64 positions; ask for at most 63"),
    # damaged transformers directories: SafetensorError, transformers' RuntimeError
    (["generate", "--model", "{truncated}", "--prompt", "w1", "--max-new-tokens", "1"], "damaged or truncated"),
    (["inspect", "--model", "{mismatched}", "--text", "w1", "--out", "{out}"],
     "config.json makes it [32, 48]: the config and the weights come from different models"),
    # a speech model given text: a traceback (no input_features) or transformers' own words
    (["analyze", "--model", "{whisper}", "--data", "{texts}", "--out", "{out}"], "is a speech model"),
    (["generate", "--model", "{whisper}", "--prompt", "w1 w2"], "--audio CLIP.wav draws its attention"),
    (["align", "--model", "{whisper}", "--pairs", "{pairs}", "--out", "{out}"], "is a speech model"),
    # an image model given text: 'no tokenizer.json'
    (["inspect", "--model", "{vit}", "--text", "w1", "--out", "{out}"], "is an image model"),
    (["heads", "--model", "{vit}", "--out", "{out}"], "give --image (inspect, explain) or --images (analyze)"),
    # compare paired head k of one model with head k of any other, whatever their shapes and tokens
    (["compare", "--model", "{qwen3}", "--model", "minilm", "--data", "{texts}", "--out", "{out}"],
     "2 attention layers of 4 heads each, minilm 6 attention layers of 12 heads each"),
    (["compare", "--model", "{qwen3}", "--model", "{reversed_tokenizer}", "--data", "{texts}", "--out", "{out}"],
     "tokenize the texts differently"),
])
def test_kinds_a_command_does_not_take_and_damaged_directories_get_one_line(dirs, tmp_path, capsys, argv,
                                                                            expected):
    (dirs / "texts.txt").write_text("w1 w2 w3\nw4 w5 w6 w7\n")
    (dirs / "pairs.txt").write_text("w1 w2 w3 ||| w4 w5\n")
    names = {path.stem: str(path) for path in dirs.iterdir()}
    argv = [part.format(out=tmp_path / "out", **names) for part in argv]
    line = _one_line_error(argv, capsys)
    assert expected in line, line
    assert not (tmp_path / "out").exists()  # nothing written that would block the corrected command


COMMANDS = {
    "inspect --text": ["inspect", "--text", "w1 w2 w3", "--out", "{out}"],
    "inspect --source": ["inspect", "--source", "w1 w2 w3", "--target", "w4 w5", "--out", "{out}"],
    "inspect --image": ["inspect", "--image", "{image}", "--out", "{out}"],
    "inspect --audio": ["inspect", "--audio", "{audio}", "--max-new-tokens", "2", "--out", "{out}"],
    "analyze --data": ["analyze", "--data", "{texts}", "--out", "{out}", "--no-progress"],
    "analyze --images": ["analyze", "--images", "{images}", "--out", "{out}", "--no-progress"],
    "generate": ["generate", "--prompt", "w1 w2", "--max-new-tokens", "2", "--report", "{out}"],
    "explain --text": ["explain", "--text", "w1 w2 w3", "--out", "{out}", "--method", "raw", "rollout"],
    "explain --prompt": ["explain", "--prompt", "w1 w2", "--max-new-tokens", "1", "--out", "{out}", "--method", "raw"],
    "explain --image": ["explain", "--image", "{image}", "--out", "{out}"],
    "heads": ["heads", "--out", "{out}", "--length", "4"],
    "compare": ["compare", "--model", "{model}", "--data", "{texts}", "--out", "{out}"],
    "align": ["align", "--pairs", "{pairs}", "--out", "{out}"],
}
KINDS = ["qwen3", "bart", "whisper", "vit", "truncated", "mismatched", "empty", "missing"]


@pytest.fixture(scope="module")
def inputs(dirs) -> dict:
    import wave

    import numpy as np
    from PIL import Image

    (dirs / "empty").mkdir(exist_ok=True)
    (dirs / "images").mkdir(exist_ok=True)
    picture = (np.random.default_rng(0).random((40, 40, 3)) * 255).astype("uint8")
    Image.fromarray(picture).save(dirs / "images" / "a.png")
    with wave.open(str(dirs / "clip.wav"), "wb") as clip:
        clip.setnchannels(1), clip.setsampwidth(2), clip.setframerate(16000)
        clip.writeframes((np.random.default_rng(0).standard_normal(1600) * 3000).astype("<i2").tobytes())
    (dirs / "texts.txt").write_text("w1 w2 w3\nw4 w5 w6 w7\n")
    (dirs / "pairs.txt").write_text("w1 w2 w3 ||| w4 w5\n")
    return {"image": dirs / "images" / "a.png", "images": dirs / "images", "audio": dirs / "clip.wav",
            "texts": dirs / "texts.txt", "pairs": dirs / "pairs.txt"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_every_command_on_every_kind_works_or_says_why_in_one_line(dirs, inputs, tmp_path, capsys, kind):
    """The newcomer's pass, kept: each command against a decoder, an encoder-decoder, a speech
    and an image model, and damaged, empty and missing directories. Each either works or exits
    2 with one line; never a traceback, and a refused command writes nothing."""
    model = str(dirs / kind)
    problems = []
    for name, argv in COMMANDS.items():
        out = tmp_path / name.replace(" ", "").replace("-", "_")
        argv = [argv[0], "--model", model] + [part.format(out=out, model=model, **inputs) for part in argv[1:]]
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
        except Exception as error:  # noqa: BLE001  what main let through is the defect this test looks for
            problems.append(f"{name}: {type(error).__name__}: {error}")
            continue
        err = capsys.readouterr().err
        lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and "Loading weights" not in line]
        if code == 2 and (len(lines) != 1 or out.exists()):
            problems.append(f"{name}: exit 2 with {lines!r}, wrote {out.exists()}")
        elif code not in (0, 2):
            problems.append(f"{name}: exit {code}")
    assert not problems, "\n".join(problems)
