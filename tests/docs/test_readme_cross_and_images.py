"""The README's translation and vision sections run as written, on their own: their Python
blocks, and their commands with the placeholder directories (``MARIAN_DIR``, ``VIT_DIR``, ...)
replaced by tiny random models saved here and the files they name written here."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="these sections open transformers models")

from attnlab.cli import main  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"
SECTIONS = {"translation": "### Translation models", "vision": "### Vision transformers"}
WORDS = "the dog barks der Hund bellt".split()


def _section(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(heading)
    following = re.search(r"\n#{2,3} ", text[start + len(heading):])
    return text[start:start + len(heading) + following.start()] if following else text[start:]


def _blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def _commands(section: str) -> list[list[str]]:
    lines = [line.split("  #", 1)[0].strip() for block in _blocks(section, "sh") for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith("attnlab ")]


@pytest.mark.parametrize("name", list(SECTIONS))
def test_the_sections_python_runs_as_written(name, tmp_path, monkeypatch):
    blocks = _blocks(_section(SECTIONS[name]), "python")
    assert blocks, f"the README's {name} section lost its Python block"
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, f"README.md {name} block", "exec"), {"__name__": "readme"})


def _tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocabulary = {"<pad>": 0, "<s>": 1, "</s>": 2, **{word: index for index, word in enumerate(WORDS, 3)}}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    tokenizer.save(str(directory / "tokenizer.json"))


def _placeholders(root: Path) -> dict[str, str]:
    """The directories and files the README's commands name, made small."""
    torch.manual_seed(0)
    small = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=64, decoder_ffn_dim=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                 decoder_start_token_id=1)
    marian = root / "marian"
    transformers.MarianMTModel(transformers.MarianConfig(vocab_size=16, max_position_embeddings=64, **small)
                               ).eval().save_pretrained(marian)
    _tokenizer(marian)
    whisper = root / "whisper"
    transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
        vocab_size=16, num_mel_bins=8, max_source_positions=50, max_target_positions=32, **small)
    ).eval().save_pretrained(whisper)
    transformers.WhisperFeatureExtractor(feature_size=8, chunk_length=1).save_pretrained(whisper)
    _tokenizer(whisper)
    vision = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64)
    vit = root / "vit"
    transformers.ViTModel(transformers.ViTConfig(**vision), add_pooling_layer=False).eval().save_pretrained(vit)
    classifier = root / "vit-classifier"
    transformers.ViTForImageClassification(transformers.ViTConfig(
        **vision, num_labels=2, id2label={0: "cat", 1: "dog"}, label2id={"cat": 0, "dog": 1})
    ).eval().save_pretrained(classifier)
    return {"MARIAN_DIR": str(marian), "WHISPER_DIR": str(whisper), "VIT_DIR": str(vit),
            "VIT_CLASSIFIER_DIR": str(classifier)}


def _files(root: Path) -> None:
    import wave

    from PIL import Image

    (root / "pairs.txt").write_text("the dog barks ||| der Hund bellt\n")
    (root / "gold.txt").write_text("0-0 1-1 2-2\n")
    picture = np.random.default_rng(0).integers(0, 255, (40, 56, 3), dtype=np.uint8)
    Image.fromarray(picture).save(root / "cat.png")
    (root / "pictures").mkdir()
    for index in range(2):
        Image.fromarray(np.roll(picture, 7 * index, axis=1)).save(root / "pictures" / f"{index}.png")
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(8000) / 16000) * 32767).astype("<i2")
    with wave.open(str(root / "clip.wav"), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(16000)
        writer.writeframes(tone.tobytes())


def test_the_sections_commands_run_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    names = _placeholders(tmp_path)
    _files(tmp_path)
    commands = [command for name in SECTIONS for command in _commands(_section(SECTIONS[name]))]
    assert len(commands) >= 8, "the README's translation and vision sections lost their commands"
    for command in commands:
        argv = [names.get(word, word) for word in command[1:]]
        assert main(argv) == 0, f"{shlex.join(command)}: {capsys.readouterr().err}"
    for written in ("pair/report.html", "generated/generation.html", "pred.txt", "speech/report.html",
                    "cat/rollout.png", "why/explanation.png", "stats/statistics.json"):
        assert (tmp_path / written).is_file(), written
