"""``attnlab inspect`` on a source/target pair and on an image, ``attnlab generate`` on a seq2seq
model, and ``attnlab align``: run for real on tiny random transformers models."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="these commands open transformers directories")

from attnlab.cli import main  # noqa: E402

WORDS = [f"w{i}" for i in range(3, 60)]


def _bart_dir(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    torch.manual_seed(0)
    config = transformers.BartConfig(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, forced_eos_token_id=None,
    )
    directory = tmp_path / "bart"
    transformers.BartForConditionalGeneration(config).eval().save_pretrained(directory)
    vocabulary = {"<pad>": 0, "<s>": 1, "</s>": 2, **{word: index for index, word in enumerate(WORDS, 3)}}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def test_inspect_a_pair_writes_the_cross_attention_page_pictures_statistics_and_alignment(tmp_path, capsys):
    model = _bart_dir(tmp_path)
    out = tmp_path / "pair"
    code = main(["inspect", "--model", str(model), "--source", "w3 w4 w5 w6", "--target", "w7 w8 w9",
                 "--out", str(out), "--format", "png"])
    assert code == 0, capsys.readouterr().err
    assert {"report.html", "encoder.html", "decoder.html", "cross_layer_1.png", "cross_layer_2.png",
            "statistics.json", "alignment.txt"} <= {path.name for path in out.iterdir()}
    page = (out / "report.html").read_text()
    data = json.loads(page.split('type="application/json">', 1)[1].split("</script>", 1)[0])
    assert data["tokens"] == ["<s>", "w7", "w8", "w9", "</s>"] and data["key_tokens"] == ["w3", "w4", "w5", "w6", "</s>"]
    assert data["sides"] == ["target", "source"] and data["layers"] == ["cross.layer_1", "cross.layer_2"]
    statistics = json.loads((out / "statistics.json").read_text())
    cross = statistics["layers"]["cross.layer_1"]
    assert (cross["queries"], cross["keys"], cross["kind"]) == ("target", "source", "cross")
    assert "mean_distance" not in cross and "mean_distance" in statistics["layers"]["encoder.layer_1"]
    assert len(cross["entropy"]) == 4
    links = (out / "alignment.txt").read_text().split()
    # w7 w8 w9 </s> after the start token, each read at the step that predicts it
    assert len(links) == 4 and {int(link.split("-")[1]) for link in links} == set(range(4))


def test_generate_on_a_seq2seq_model_writes_the_step_through_page(tmp_path, capsys):
    model = _bart_dir(tmp_path)
    report = tmp_path / "generated"
    code = main(["generate", "--model", str(model), "--prompt", "w3 w4 w5", "--max-new-tokens", "4",
                 "--report", str(report)])
    assert code == 0, capsys.readouterr().err
    assert {"generation.html", "report.html", "cross_layer_1.png"} <= {path.name for path in report.iterdir()}
    page = (report / "generation.html").read_text()
    data = json.loads(page.split('type="application/json">', 1)[1].split("</script>", 1)[0])
    assert data["prompt_length"] == 4 and len(data["tokens"]) == 4 + 4


def test_inspect_refuses_mixed_inputs_before_any_work(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["inspect", "--model", "x", "--text", "a", "--image", "y.png", "--out", str(out)]) == 2
    assert "give one input" in capsys.readouterr().err
    assert main(["inspect", "--model", "x", "--source", "a", "--out", str(out)]) == 2
    assert "--source and --target go together" in capsys.readouterr().err
    assert not out.exists()


def _vit_dir(tmp_path):
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64)
    directory = tmp_path / "vit"
    transformers.ViTModel(config, add_pooling_layer=False).eval().save_pretrained(directory)
    return directory


def _image(path, size=(40, 56)):
    from PIL import Image

    pixels = np.zeros((*size, 3), dtype=np.uint8)
    pixels[5:20, 10:30] = (250, 120, 30)
    Image.fromarray(pixels).save(path)
    return path


def test_inspect_an_image_writes_overlays_rollout_statistics_and_the_page(tmp_path, capsys):
    model, image = _vit_dir(tmp_path), _image(tmp_path / "cat.png")
    out = tmp_path / "image"
    code = main(["inspect", "--model", str(model), "--image", str(image), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert {"layer_1.png", "layer_2.png", "rollout.png", "report.html", "statistics.json"} <= {
        path.name for path in out.iterdir()}
    statistics = json.loads((out / "statistics.json").read_text())
    assert statistics["grid"] == [4, 4] and statistics["prefix_tokens"] == 1
    assert len(statistics["rollout"]["class_to_patches"]) == 16
    out2 = tmp_path / "wide"
    assert main(["inspect", "--model", str(model), "--image", str(image), "--image-size", "24x48",
                 "--out", str(out2)]) == 0
    assert json.loads((out2 / "statistics.json").read_text())["grid"] == [3, 6]
    # regression: a grid of one patch stopped the artifact-token detector
    out3 = tmp_path / "one"
    assert main(["inspect", "--model", str(model), "--image", str(image), "--image-size", "8x8",
                 "--out", str(out3)]) == 0, capsys.readouterr().err
    assert json.loads((out3 / "statistics.json").read_text())["artifact_tokens"]["tokens"] == []


def test_a_missing_or_unreadable_image_is_one_line_and_nothing_is_written(tmp_path, capsys):
    model = _vit_dir(tmp_path)
    out = tmp_path / "never"
    assert main(["inspect", "--model", str(model), "--image", str(tmp_path / "no.png"), "--out", str(out)]) == 2
    assert "--image" in capsys.readouterr().err
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    assert main(["inspect", "--model", str(model), "--image", str(bad), "--out", str(out)]) == 2
    assert "not an image Pillow can read" in capsys.readouterr().err
    # regression: a folder was reported as "no such file"
    assert main(["inspect", "--model", str(model), "--image", str(tmp_path), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "is a folder; give one PNG or JPEG file" in error and len(error.strip().splitlines()) == 1
    assert not out.exists()


def test_align_scores_a_file_against_gold_as_by_hand(tmp_path, capsys):
    (tmp_path / "gold.txt").write_text("0-0 1-1 2?2\n0-1 1?0\n")
    (tmp_path / "pred.txt").write_text("0-0 1-2 2-2\n0-1 1-0 2-2\n")
    assert main(["align", "--alignments", str(tmp_path / "pred.txt"), "--gold", str(tmp_path / "gold.txt")]) == 0
    score = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert score["aer"] == round(1 / 3, 4) and score["precision"] == round(2 / 3, 4)


@pytest.mark.parametrize("method", ["attention", "itermax"])
def test_align_with_a_model_writes_one_line_per_pair_and_scores_it(tmp_path, capsys, method):
    model = _bart_dir(tmp_path)
    (tmp_path / "pairs.txt").write_text("w3 w4 w5 ||| w6 w7\nw8 w9 ||| w10 w11 w12\n")
    (tmp_path / "gold.txt").write_text("0-0 1-1\n0-0 1-1 1?2\n")
    out = tmp_path / "pred.txt"
    args = ["align", "--model", str(model), "--pairs", str(tmp_path / "pairs.txt"), "--out", str(out),
            "--gold", str(tmp_path / "gold.txt"), "--method", method]
    if method == "attention":
        args += ["--layers", "2", "--heads", "1,3"]
    assert main(args) == 0, capsys.readouterr().err
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    if method == "attention":  # every target word gets exactly one source word
        assert sorted(int(link.split("-")[1]) for link in lines[1].split()) == [0, 1, 2]
    score = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= score["aer"] <= 1.0 and score["sentences"] == 2


def test_align_refuses_bad_arguments_in_one_line(tmp_path, capsys):
    assert main(["align", "--alignments", "p.txt"]) == 2
    assert "needs --gold" in capsys.readouterr().err
    (tmp_path / "gold.txt").write_text("0-0 1:1\n")
    (tmp_path / "pred.txt").write_text("0-0\n")
    assert main(["align", "--alignments", str(tmp_path / "pred.txt"), "--gold", str(tmp_path / "gold.txt")]) == 2
    assert "--gold gold.txt line 1: '1:1' is not a link" in capsys.readouterr().err


def test_inspect_an_image_takes_the_model_directorys_preprocessing(tmp_path, capsys):
    model, image = _vit_dir(tmp_path), _image(tmp_path / "cat.png")
    (model / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "ViTImageProcessor", "do_resize": True, "size": {"shortest_edge": 40},
        "do_center_crop": True, "crop_size": {"height": 24, "width": 40}, "resample": 3, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.4, 0.5, 0.6], "image_std": [0.2, 0.3, 0.4]}))
    out = tmp_path / "image"
    assert main(["inspect", "--model", str(model), "--image", str(image), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "preprocessing: the model directory's preprocessor_config.json" in printed
    assert json.loads((out / "statistics.json").read_text())["grid"] == [3, 5]  # the 24 x 40 crop


def _vit_classifier_dir(tmp_path):
    torch.manual_seed(0)
    labels = {0: "cat", 1: "dog"}
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64, num_labels=2, id2label=labels,
                                    label2id={v: k for k, v in labels.items()})
    directory = tmp_path / "vit-classifier"
    transformers.ViTForImageClassification(config).eval().save_pretrained(directory)
    return directory


def test_explain_an_image_writes_the_heatmaps_over_it(tmp_path, capsys):
    model, image = _vit_classifier_dir(tmp_path), _image(tmp_path / "cat.png")
    out = tmp_path / "why"
    code = main(["explain", "--model", str(model), "--image", str(image), "--target", "dog", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "explained class 'dog' (index 1" in printed and "grad-attention: strongest patch" in printed
    assert {"explanation.png", "explanation.json", "report.html"} <= {path.name for path in out.iterdir()}
    written = json.loads((out / "explanation.json").read_text())
    assert written["label"] == "dog" and written["grid"] == [4, 4]
    assert list(written["scores"]) == ["grad-attention", "rollout", "raw"]
    assert all(len(scores) == 16 for scores in written["scores"].values())
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page and "Most probable classes" in page
    assert "Statistics per layer and head" not in page  # a page of pictures has no empty statistics section


def test_explain_an_image_refuses_text_methods_and_a_model_without_classes(tmp_path, capsys):
    image = _image(tmp_path / "cat.png")
    classifier = _vit_classifier_dir(tmp_path)
    out = tmp_path / "never"
    assert main(["explain", "--model", str(classifier), "--image", str(image), "--method", "flow",
                 "--out", str(out)]) == 2
    assert "--method flow does not explain an image" in capsys.readouterr().err
    assert main(["explain", "--model", str(_vit_dir(tmp_path)), "--image", str(image), "--out", str(out)]) == 2
    assert "no [1, C] logits" in capsys.readouterr().err
    assert not out.exists()


def test_analyze_a_folder_of_images_writes_statistics_per_layer_and_head(tmp_path, capsys):
    model = _vit_dir(tmp_path)
    folder = tmp_path / "pictures"
    folder.mkdir()
    for index, size in enumerate([(40, 56), (32, 32), (64, 20)]):
        _image(folder / f"image_{index}.png", size)
    (folder / "notes.txt").write_text("not a picture")
    out = tmp_path / "stats"
    code = main(["analyze", "--model", str(model), "--images", str(folder), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert "3 images, 51 tokens, 2 layers" in capsys.readouterr().out  # 17 tokens each: class + 4 x 4
    statistics = json.loads((out / "statistics.json").read_text())
    tables = statistics["statistics"]
    assert {"entropy", "mean_attention_distance", "class_prefix_mass", "class_patch_entropy"} <= set(tables)
    assert "mean_distance" not in tables and "alignment_score" not in tables
    for name in ("mean_attention_distance", "class_prefix_mass", "class_patch_entropy", "entropy"):
        assert [len(tables[name][layer]) for layer in ("layer_1", "layer_2")] == [4, 4]
    assert all(0 <= value <= 1 for value in tables["class_prefix_mass"]["layer_1"])
    # the distance is in pixels on the 32 x 32 picture (patches of 8): between 0 and the diagonal
    assert all(0 < value < 8 * 3 * 2 ** 0.5 for value in tables["mean_attention_distance"]["layer_2"])
    page = (out / "summary.html").read_text()
    assert "3 images" in page and "figure 7" in page


def test_mean_attention_distance_is_the_hand_computed_one(tmp_path):
    from PIL import Image

    from attnlab.hf.image_analysis import analyze_images
    from attnlab.hf.vision import image_attention, image_steps

    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=16, patch_size=8, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=64)
    model = transformers.ViTModel(config, add_pooling_layer=False).eval()
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8))
    steps = image_steps(model)
    got = analyze_images(model, [picture], steps).statistics
    weights = image_attention(model, steps(picture)).attentions["layer_1"].double()  # [2, 5, 5]
    centres = [(0, 0), (0, 8), (8, 0), (8, 8)]
    for head in range(2):
        rows = weights[head, 1:, 1:] / weights[head, 1:, 1:].sum(-1, keepdim=True)
        want = sum(float(rows[t, s]) * float(np.hypot(centres[t][0] - centres[s][0], centres[t][1] - centres[s][1]))
                   for t in range(4) for s in range(4)) / 4
        assert abs(got["mean_attention_distance"]["layer_1"][head] - want) < 1e-6
        assert abs(got["class_prefix_mass"]["layer_1"][head] - float(weights[head, 0, 0])) < 1e-6


def test_analyze_images_refuses_text_options_and_an_empty_folder(tmp_path, capsys):
    model = _vit_dir(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "never"
    assert main(["analyze", "--model", str(model), "--images", str(empty), "--out", str(out)]) == 2
    assert "holds no PNG or JPEG file" in capsys.readouterr().err
    assert main(["analyze", "--model", str(model), "--images", str(empty), "--importance", "--out", str(out)]) == 2
    assert "--importance applies to --data" in capsys.readouterr().err
    assert main(["analyze", "--model", str(model), "--out", str(out)]) == 2
    assert "give --data (texts) or --images" in capsys.readouterr().err
    assert not out.exists()


def _whisper_dir(tmp_path, *, tokenizer=True):
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    config = transformers.WhisperConfig(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=50,
        max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )
    directory = tmp_path / "whisper"
    transformers.WhisperForConditionalGeneration(config).eval().save_pretrained(directory)
    transformers.WhisperFeatureExtractor(feature_size=8, chunk_length=1).save_pretrained(directory)  # 1 s: 100 frames
    if tokenizer:
        vocabulary = {"<pad>": 0, "<s>": 1, "</s>": 2, **{word: index for index, word in enumerate(WORDS, 3)}}
        words = Tokenizer(models.WordLevel(vocabulary, unk_token="<pad>"))
        words.pre_tokenizer = pre_tokenizers.Whitespace()
        words.save(str(directory / "tokenizer.json"))
    return directory


def _wav(path, seconds=0.5, rate=8000, channels=2, width=2):
    import wave

    times = np.arange(int(seconds * rate)) / rate
    tone = 0.5 * np.sin(2 * np.pi * 440 * times)
    samples = np.repeat((tone * 32767).astype("<i2")[:, None], channels, axis=1)
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(width)
        writer.setframerate(rate)
        writer.writeframes(samples.tobytes())
    return path


def test_inspect_a_clip_through_whisper_writes_cross_attention_over_time(tmp_path, capsys, monkeypatch):
    from attnlab.workflows import inspect_pair

    model, clip = _whisper_dir(tmp_path), _wav(tmp_path / "clip.wav")
    out = tmp_path / "audio"
    drawn, save = [], inspect_pair.save_figure
    monkeypatch.setattr(inspect_pair, "save_figure",
                        lambda figure, *rest: drawn.append(figure) or save(figure, *rest))
    code = main(["inspect", "--model", str(model), "--audio", str(clip), "--max-new-tokens", "3",
                 "--out", str(out), "--format", "png"])
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "0.50 s at 8000 Hz -> 8 mel channels x 100 frames" in printed
    assert {"report.html", "encoder.html", "decoder.html", "generation.html", "cross_layer_1.png",
            "statistics.json"} <= {path.name for path in out.iterdir()}
    # the pictures' time axis reads in seconds, not in encoder positions
    ticks = [[label.get_text() for label in ax.get_xticklabels()] for ax in drawn[0].axes if ax.get_xlabel()]
    assert ticks and all(labels == ["0.0 s", "0.1 s", "0.2 s", "0.3 s", "0.4 s", "0.5 s"] for labels in ticks)
    statistics = json.loads((out / "statistics.json").read_text())
    # the 0.5 s clip covers 25 of the window's 50 positions: the padding's columns are cut
    assert statistics["source_tokens"][:3] == ["0.00s", "0.02s", "0.04s"] and len(statistics["source_tokens"]) == 25
    assert statistics["layers"]["cross.layer_1"]["keys"] == "source" and "25 encoder positions" in printed
    words = json.loads((out / "words.json").read_text())["words"]
    assert all(0.0 <= word["start"] <= word["end"] <= 0.5 for word in words)
    assert statistics["layers"]["cross.layer_2"]["keys"] == "source"
    page = (out / "report.html").read_text()
    data = json.loads(page.split('type="application/json">', 1)[1].split("</script>", 1)[0])
    assert data["sides"] == ["target", "time (s)"] and data["tokens"][0] == "<s>"


def test_the_clips_features_are_the_feature_extractors_and_a_target_is_scored(tmp_path, capsys):
    import wave

    from attnlab.hf.audio import audio_features, read_wav
    from attnlab.hf.seq2seq import pair_attention

    model_dir, clip = _whisper_dir(tmp_path), _wav(tmp_path / "clip.wav", rate=16000, channels=1)
    samples, rate = read_wav(clip)
    with wave.open(str(clip)) as reader:
        raw = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2") / 32768.0
    np.testing.assert_allclose(samples, raw, atol=1e-7)
    model = transformers.WhisperForConditionalGeneration.from_pretrained(model_dir).eval()
    got = audio_features(model_dir, model, samples, rate)
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(model_dir)
    want = extractor(raw.astype(np.float32), sampling_rate=16000, return_tensors="np")["input_features"][0]
    np.testing.assert_allclose(got.features.numpy(), want, atol=1e-6)
    assert got.seconds_per_position == 0.02
    out = tmp_path / "scored"
    assert main(["inspect", "--model", str(model_dir), "--audio", str(clip), "--target", "w3 w4", "--out",
                 str(out)]) == 0, capsys.readouterr().err
    statistics = json.loads((out / "statistics.json").read_text())
    assert statistics["target_tokens"] == ["<s>", "w3", "w4"] and "generation.html" not in {
        path.name for path in out.iterdir()}
    pair = pair_attention(model, None, torch.tensor([1, 3, 4]), source_features=got.features)
    assert pair.cross["cross.layer_1"].shape == (4, 3, 50)


def test_a_bad_clip_is_one_line_and_nothing_is_written(tmp_path, capsys):
    model = _whisper_dir(tmp_path, tokenizer=False)
    out = tmp_path / "never"
    assert main(["inspect", "--model", str(model), "--audio", str(tmp_path / "no.wav"), "--out", str(out)]) == 2
    assert "--audio" in capsys.readouterr().err
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF not really")
    assert main(["inspect", "--model", str(model), "--audio", str(bad), "--out", str(out)]) == 2
    assert "is not a PCM WAV file" in capsys.readouterr().err
    long = _wav(tmp_path / "long.wav", seconds=1.5)
    assert main(["inspect", "--model", str(model), "--audio", str(long), "--out", str(out)]) == 2
    assert "longer than the model's window of 1 s" in capsys.readouterr().err
    assert main(["inspect", "--model", str(model), "--text", "a", "--max-new-tokens", "2", "--out", str(out)]) == 2
    assert "--max-new-tokens applies to --audio" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("rows, kept", [("predicting", slice(0, -1)), ("reading", slice(1, None))])
def test_align_takes_the_rows_that_predict_each_target_token_or_those_that_read_it(tmp_path, capsys, rows, kept):
    from attnlab.hf.seq2seq import pair_attention
    from attnlab.inspect.compute.word_alignment import attention_alignment, format_pharaoh

    model = _bart_dir(tmp_path)
    (tmp_path / "pairs.txt").write_text("w3 w4 w5 w6 ||| w7 w8 w9 w10 w11\n")
    out = tmp_path / "pred.txt"
    assert main(["align", "--model", str(model), "--pairs", str(tmp_path / "pairs.txt"), "--out", str(out),
                 "--rows", rows]) == 0, capsys.readouterr().err
    bart = transformers.BartForConditionalGeneration.from_pretrained(model).eval()
    pair = pair_attention(bart, torch.tensor([3, 4, 5, 6]), torch.tensor([1, 7, 8, 9, 10, 11]))  # start token first
    want = attention_alignment({name: weights[:, kept] for name, weights in pair.cross.items()})
    assert out.read_text().strip() == format_pharaoh(want)


def test_align_audio_times_words_and_refuses_text_models_and_wavs_as_pairs(tmp_path, capsys):
    whisper, bart, clip = _whisper_dir(tmp_path), _bart_dir(tmp_path), _wav(tmp_path / "clip.wav")
    out = tmp_path / "words.json"
    assert main(["align", "--model", str(whisper), "--audio", str(clip), "--target", "w3 w4", "--out",
                 str(out)]) == 0, capsys.readouterr().err
    written = json.loads(out.read_text())
    assert [word["word"] for word in written["words"]] == ["w3", "w4"]
    assert all(0.0 <= word["start"] <= word["end"] <= 0.5 for word in written["words"])  # seconds, not frames
    out.unlink()
    assert main(["align", "--model", str(bart), "--audio", str(clip), "--out", str(out)]) == 2
    assert "--audio needs a speech encoder-decoder (Whisper)" in capsys.readouterr().err
    assert main(["align", "--model", str(bart), "--pairs", str(clip), "--out", str(out)]) == 2
    assert "is not UTF-8 text (a WAV clip goes to --audio" in capsys.readouterr().err
    assert main(["inspect", "--model", str(bart), "--audio", str(clip), "--out", str(tmp_path / "x")]) == 2
    assert "--audio needs a speech encoder-decoder (Whisper)" in capsys.readouterr().err
    assert not out.exists()
