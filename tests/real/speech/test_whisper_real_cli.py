"""``attnlab inspect --audio`` and ``attnlab align --audio`` on Whisper tiny.en and a spoken sentence:
readable token labels, the time axis cut to the clip and labelled in seconds, word times in seconds;
one-line errors for bad inputs."""

from __future__ import annotations

import json

import pytest

from attnlab.cli import main


def test_inspect_audio_labels_tokens_as_text_and_time_in_seconds(whisper_tiny, spoken, tmp_path, capsys,
                                                                 monkeypatch):
    from attnlab.workflows import inspect_pair

    sentence = spoken[0]
    out = tmp_path / "inspect"
    drawn, save = [], inspect_pair.save_figure
    monkeypatch.setattr(inspect_pair, "save_figure",
                        lambda figure, *rest: drawn.append(figure) or save(figure, *rest))
    assert main(["inspect", "--model", str(whisper_tiny), "--audio", str(sentence.wav), "--out", str(out),
                 "--format", "png"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    statistics = json.loads((out / "statistics.json").read_text())
    tokens = statistics["target_tokens"]
    assert tokens[:3] == ["<|startoftranscript|>", "<|notimestamps|>", " The"]
    assert " quick" in tokens and not any("Ġ" in token for token in tokens)  # byte-level marks decoded
    positions = int(sentence.words[-1].end / 0.02) + 15  # the last word, then 0.3 s of silence
    assert abs(len(statistics["source_tokens"]) - positions) <= 1  # not the window's 1,500
    assert statistics["source_tokens"][-1].endswith("s")
    words = json.loads((out / "words.json").read_text())["words"]
    assert [word["word"] for word in words] == ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy",
                                                "dog."]
    for got, truth in zip(words, sentence.words):
        assert abs(got["start"] - truth.start) < 0.35 and abs(got["end"] - truth.end) < 0.35
    page = (out / "report.html").read_text()
    assert "<b>words (s):</b> The 0.00-" in page and "<b>clip:</b> 5.13 s: 256 encoder positions" in page
    assert "words (start-end in seconds): The 0.00-" in printed
    assert not (out / "alignment.txt").exists()
    # Regression: cross_layer_<k>.png ticked its time axis with pooled positions ("0-3", "12-15")
    assert (out / "cross_layer_4.png").is_file() and len(drawn) == 4
    bottom = [ax for ax in drawn[-1].axes if ax.get_xlabel() == "time (s)"]
    assert len(bottom) == 3  # six heads in two rows of three: the bottom row carries the axis
    for ax in bottom:
        assert [label.get_text() for label in ax.get_xticklabels()] == [f"{s} s" for s in range(6)]


def test_align_audio_writes_word_timestamps_in_seconds(whisper_tiny, spoken, tmp_path, capsys):
    sentence = spoken[1]
    out = tmp_path / "words.json"
    assert main(["align", "--model", str(whisper_tiny), "--audio", str(sentence.wav), "--target", sentence.text,
                 "--out", str(out)]) == 0, capsys.readouterr().err
    written = json.loads(out.read_text())
    assert written["transcript"] == sentence.text
    assert [word["word"] for word in written["words"]] == sentence.text.split()
    errors = [abs(got["start"] - truth.start) + abs(got["end"] - truth.end)
              for got, truth in zip(written["words"], sentence.words)]
    assert sum(errors) / (2 * len(errors)) < 0.25


@pytest.mark.parametrize("case, message", [
    ("missing", "--audio '{missing}': no such file"),
    ("not_wav", "is not a PCM WAV file"),
    ("no_out", "--audio needs --out WORDS.json"),
    ("with_pairs", "--audio takes --model (a Whisper directory) and --out"),
    ("target_alone", "--target goes with --audio"),
    ("pairs_to_whisper", "--audio CLIP.wav --out WORDS.json times its words"),
])
def test_bad_audio_alignments_are_one_line(whisper_tiny, spoken, tmp_path, capsys, case, message):
    missing, not_wav = tmp_path / "none.wav", tmp_path / "text.wav"
    not_wav.write_text("hello ||| bonjour\n")
    out = str(tmp_path / "words.json")
    model, wav = str(whisper_tiny), str(spoken[0].wav)
    arguments = {
        "missing": ["--model", model, "--audio", str(missing), "--out", out],
        "not_wav": ["--model", model, "--audio", str(not_wav), "--out", out],
        "no_out": ["--model", model, "--audio", wav],
        "with_pairs": ["--model", model, "--audio", wav, "--pairs", str(not_wav), "--out", out],
        "target_alone": ["--model", model, "--target", "hello", "--out", out],
        "pairs_to_whisper": ["--model", model, "--pairs", str(not_wav), "--out", out],
    }[case]
    assert main(["align", *arguments]) == 2
    error = capsys.readouterr().err
    assert message.format(missing=missing) in error and len(error.strip().splitlines()) == 1
    assert not (tmp_path / "words.json").exists()
