"""A vision-language model's image tokens laid back onto the picture, and what each generated
word looked at: tiny random LLaVA and Idefics 3 models, against transformers' own processor and
a hand computation of where each token lies."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="vision-language models need the hf extra")
Image = pytest.importorskip("PIL.Image", reason="images need the images extra")

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers  # noqa: E402

from attnlab.hf.vision_language import (  # noqa: E402
    generated_word_attention,
    vision_language_inputs,
)

WORDS = ["<pad>", "<s>", "</s>", "a", "cat", "on", "the", "mat", "what", "is", "here", "User:", "Assistant:"]
SPECIAL = ["<image>", "<fake_token_around_image>", "<global-img>", "<|image_pad|>", "<|vision_start|>",
           "<|vision_end|>"] + [
    f"<row_{r}_col_{c}>" for r in range(1, 5) for c in range(1, 5)]


def _tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel({word: index for index, word in enumerate(WORDS)}, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([AddedToken(token, normalized=False) for token in SPECIAL])
    tokenizer.add_tokens([AddedToken("\n", normalized=False)])
    return tokenizer


def _picture(height: int, width: int) -> "Image.Image":
    generator = np.random.default_rng(0)
    return Image.fromarray(generator.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _llava(tokenizer: Tokenizer):
    from attnlab.hf.census_models import shrink

    config = shrink(transformers.LlavaConfig())
    config.image_token_index = tokenizer.token_to_id("<image>")
    config.text_config.vocab_size = tokenizer.get_vocab_size()
    torch.manual_seed(0)
    return transformers.LlavaForConditionalGeneration(config).eval()


def _idefics3(tokenizer: Tokenizer):
    from attnlab.hf.census_models import shrink

    config = shrink(transformers.Idefics3Config())
    config.image_token_id = tokenizer.token_to_id("<image>")
    config.text_config.vocab_size = config.vocab_size = tokenizer.get_vocab_size()
    torch.manual_seed(0)
    return transformers.Idefics3ForConditionalGeneration(config).eval()


def _qwen2_vl(tokenizer: Tokenizer, config_class: str = "Qwen2VLConfig"):
    from attnlab.hf.census_models import shrink

    config = shrink(getattr(transformers, config_class)())
    config.image_token_id = tokenizer.token_to_id("<|image_pad|>")
    config.vision_start_token_id = tokenizer.token_to_id("<|vision_start|>")
    config.text_config.vocab_size = config.vocab_size = tokenizer.get_vocab_size()
    torch.manual_seed(0)
    return getattr(transformers, config_class.replace("Config", "ForConditionalGeneration"))(config).eval()


GRID_SETTINGS = {"patch_size": 8, "merge_size": 2, "temporal_patch_size": 2,
                 "size": {"shortest_edge": 32 * 32, "longest_edge": 64 * 64}}
SETTINGS = {"size": {"longest_edge": 64}, "max_image_size": {"longest_edge": 32}, "do_image_splitting": True,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 1}


def test_idefics3_inputs_equal_its_processor():
    """Ids and pixels as transformers' ``Idefics3Processor`` makes them (its Pillow backend): a
    wide picture cut into 1 x 2 tiles, a tall one into 2 x 1, a small square one enlarged to 2 x 2."""
    from transformers import Idefics3Processor, PreTrainedTokenizerFast
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = _tokenizer()
    model = _idefics3(tokenizer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>")
    wrapped.add_special_tokens({"additional_special_tokens": SPECIAL})
    processor = Idefics3Processor(image_processor=Idefics3ImageProcessorPil(**SETTINGS), tokenizer=wrapped,
                                  image_seq_len=4)
    for height, width, tiles in ((30, 60, 3), (70, 20, 3), (20, 20, 5)):
        picture = _picture(height, width)
        prompt = "User: <image> what is here Assistant:"
        want = processor(text=prompt, images=[picture], return_tensors="pt")
        got = vision_language_inputs(model, tokenizer, picture, prompt, processor_settings=SETTINGS)
        assert got.inputs["input_ids"].tolist() == want["input_ids"].tolist()
        assert got.inputs["pixel_values"].shape == want["pixel_values"].shape == (1, tiles, 3, 32, 32)
        assert torch.allclose(got.inputs["pixel_values"], want["pixel_values"].float(), atol=1e-5)
        assert len(got.image_tokens.tiles) == tiles


def test_idefics3_tokens_lie_on_their_tiles_by_hand():
    """A 30 x 60 picture: tiles 1,1 and 1,2 then the whole image, 4 tokens each (32-pixel tiles,
    8-pixel patches, pixel shuffle by 2: a 2 x 2 grid), laid out after ``<fake><row_r_col_c>``."""
    tokenizer = _tokenizer()
    model = _idefics3(tokenizer)
    prepared = vision_language_inputs(model, tokenizer, _picture(30, 60), "<image> what is here",
                                      processor_settings=SETTINGS)
    tokens = prepared.image_tokens
    ids = prepared.inputs["input_ids"][0].tolist()
    image, fake = tokenizer.token_to_id("<image>"), tokenizer.token_to_id("<fake_token_around_image>")
    # by hand: fake row11 i i i i fake row12 i i i i \n \n fake global i i i i fake what is here
    assert ids[:2] == [fake, tokenizer.token_to_id("<row_1_col_1>")] and ids[6:8] == [fake, tokenizer.token_to_id(
        "<row_1_col_2>")]
    assert tokens.positions.tolist() == [2, 3, 4, 5, 8, 9, 10, 11, 16, 17, 18, 19]
    assert all(ids[p] == image for p in tokens.positions.tolist())
    assert tokens.tile.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert tokens.row.tolist() == [0, 0, 1, 1] * 3 and tokens.column.tolist() == [0, 1, 0, 1] * 3
    assert [tile.name for tile in tokens.tiles] == ["tile 1,1", "tile 1,2", "whole image"]
    assert tokens.picture.shape == (32, 64, 3)
    weights = torch.arange(12, dtype=torch.float32)
    maps = tokens.picture_maps(weights)
    np.testing.assert_array_equal(maps["tiles"], [[0, 1, 4, 5], [2, 3, 6, 7]])
    np.testing.assert_array_equal(maps["whole image"], [[8, 9], [10, 11]])


def test_qwen2_vl_inputs_equal_its_processor_and_lie_on_the_merged_grid():
    """Flattened patches and grid as transformers' Qwen2-VL image processor makes them (its
    Pillow backend), and the prompt's image token repeated once per merged window, as
    ``Qwen2VLProcessor`` repeats it; each token one 2 x 2 window of 8-pixel patches, row-major
    (by hand: a 40 x 90 picture is resized to 32 x 96, sides rounded to 16 pixels, a 2 x 6 grid of
    tokens)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = _tokenizer()
    model = _qwen2_vl(tokenizer)
    images = Qwen2VLImageProcessorPil(**GRID_SETTINGS)
    prompt = "User: <|vision_start|><|image_pad|><|vision_end|> what is here"
    for height, width in ((40, 90), (90, 40), (20, 20)):
        picture = _picture(height, width)
        want = images(images=[picture], return_tensors="pt")
        got = vision_language_inputs(model, tokenizer, picture, prompt, processor_settings=GRID_SETTINGS)
        assert got.inputs["image_grid_thw"].tolist() == want["image_grid_thw"].tolist()
        assert torch.allclose(got.inputs["pixel_values"], want["pixel_values"].float(), atol=1e-4)
        count = int(want["image_grid_thw"].prod()) // 4
        expanded = prompt.replace("<|image_pad|>", "<|image_pad|>" * count)
        assert got.inputs["input_ids"][0].tolist() == tokenizer.encode(expanded).ids
        image = tokenizer.token_to_id("<|image_pad|>")
        assert got.inputs["mm_token_type_ids"].tolist() == (got.inputs["input_ids"] == image).long().tolist()
    tokens = vision_language_inputs(model, tokenizer, _picture(40, 90), "what is here",
                                    processor_settings=GRID_SETTINGS).image_tokens
    assert tokens.picture.shape == (32, 96, 3) and tokens.tiles[0].grid == (2, 6)
    assert tokens.positions.tolist() == list(range(1, 13))  # after <|vision_start|>
    assert tokens.row.tolist() == [0] * 6 + [1] * 6 and tokens.column.tolist() == list(range(6)) * 2


@pytest.mark.parametrize("family", ["llava", "idefics3", "qwen2_vl", "qwen2_5_vl"])
def test_each_generated_word_looked_at_the_rows_of_its_forward(family):
    """The map of each new token is the mean over heads (and layers) of the language model's
    row that predicted it, at the image tokens' columns: computed by hand from eager's weights."""
    tokenizer = _tokenizer()
    model = {"llava": _llava, "idefics3": _idefics3, "qwen2_vl": _qwen2_vl,
             "qwen2_5_vl": lambda tokens: _qwen2_vl(tokens, "Qwen2_5_VLConfig")}[family](tokenizer)
    grid = family.startswith("qwen")
    prepared = vision_language_inputs(model, tokenizer, _picture(30, 60),
                                      f"<s> {'<|image_pad|>' if grid else '<image>'} what is here",
                                      processor_settings=GRID_SETTINGS if grid else SETTINGS)
    words = generated_word_attention(model, tokenizer, prepared, max_new_tokens=3)
    assert len(words.tokens) == 3 and words.image.shape == (3, len(prepared.image_tokens.positions))
    prompt = prepared.inputs["input_ids"].shape[1]
    ids = torch.cat([prepared.inputs["input_ids"], torch.tensor([words.ids[:-1]])], dim=1)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        extended = {**prepared.inputs, "input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if "mm_token_type_ids" in extended:  # the new tokens are text
            extended["mm_token_type_ids"] = torch.nn.functional.pad(extended["mm_token_type_ids"], (0, 2))
        eager = model(**extended, output_attentions=True)
        greedy = model.generate(**prepared.inputs, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert words.ids == greedy[0, prompt:].tolist()
    language = eager.attentions[-2:] if family == "llava" else eager.attentions  # the language model's 2 layers
    rows = torch.arange(prompt - 1, prompt + 2)
    want = torch.stack([layer[0].mean(0)[rows] for layer in language]).mean(0)[:, prepared.image_tokens.positions]
    assert torch.allclose(words.image, want, atol=1e-6)
    assert torch.allclose(words.image_share, want.sum(-1), atol=1e-6)
    # layer 2 alone
    second = generated_word_attention(model, tokenizer, prepared, max_new_tokens=3, layers=[2])
    assert torch.allclose(second.image, language[-1][0].mean(0)[rows][:, prepared.image_tokens.positions], atol=1e-6)
    assert second.layers[0].endswith("layer_2")


def test_llava_tokens_are_the_patch_grid():
    tokenizer = _tokenizer()
    model = _llava(tokenizer)
    prepared = vision_language_inputs(model, tokenizer, _picture(40, 50), "<s> <image> what")
    tokens = prepared.image_tokens
    assert tokens.positions.tolist() == list(range(1, 17))  # after <s>: 32 / 8 = 4 x 4 patches
    assert tokens.row.tolist() == [r for r in range(4) for _ in range(4)]
    assert tokens.column.tolist() == list(range(4)) * 4
    assert list(tokens.picture_maps(torch.arange(16.0))) == ["whole image"]
    with pytest.raises(ValueError, match="2 images"):
        vision_language_inputs(model, tokenizer, _picture(40, 50), "<image> <image>")


def _directory(tmp_path, family: str):
    tokenizer = _tokenizer()
    model = {"llava": _llava, "idefics3": _idefics3, "qwen2_vl": _qwen2_vl}[family](tokenizer)
    directory = tmp_path / family
    model.save_pretrained(directory)
    tokenizer.save(str(directory / "tokenizer.json"))
    if family != "llava":
        settings = SETTINGS if family == "idefics3" else GRID_SETTINGS
        (directory / "preprocessor_config.json").write_text(json.dumps(settings))
    return directory, model, tokenizer


@pytest.mark.parametrize("family", ["llava", "idefics3", "qwen2_vl"])
def test_inspect_with_image_and_prompt_writes_each_word_on_the_picture(tmp_path, family, capsys):
    from attnlab.cli import main

    directory, model, tokenizer = _directory(tmp_path, family)
    _picture(300, 600).save(tmp_path / "picture.png")
    prompt = "User: <|image_pad|> what is here" if family == "qwen2_vl" else "User: <image> what is here Assistant:"
    assert main(["inspect", "--model", str(directory), "--image", str(tmp_path / "picture.png"), "--prompt", prompt,
                 "--out", str(tmp_path / "out"), "--max-new-tokens", "2"]) == 0
    printed = capsys.readouterr().out
    assert "image tokens on" in printed and "words_on_image.png" in printed
    document = json.loads((tmp_path / "out" / "vision_language.json").read_text())
    settings = {"llava": None, "idefics3": SETTINGS, "qwen2_vl": GRID_SETTINGS}[family]
    prepared = vision_language_inputs(model, tokenizer, Image.open(tmp_path / "picture.png"), prompt,
                                      processor_settings=settings)
    words = generated_word_attention(model, tokenizer, prepared, max_new_tokens=2)
    assert [entry["token"] for entry in document["generated"]] == words.tokens
    assert [entry["image_share"] for entry in document["generated"]] == pytest.approx(words.image_share.tolist(),
                                                                                     abs=1e-6)
    assert document["image_tokens"] == len(prepared.image_tokens.positions)
    assert [tile["name"] for tile in document["tiles"]] == (
        ["tile 1,1", "tile 1,2", "whole image"] if family == "idefics3" else ["whole image"])
    assert (tmp_path / "out" / "words_on_image.png").stat().st_size > 0


def test_prompt_with_image_refuses_what_it_cannot_do(tmp_path, capsys):
    from attnlab.cli import main
    from attnlab.hf.census_models import shrink

    directory, _, _ = _directory(tmp_path, "llava")
    picture = tmp_path / "picture.png"
    _picture(40, 40).save(picture)
    vit = tmp_path / "vit"
    transformers.ViTModel(shrink(transformers.ViTConfig())).save_pretrained(vit)
    cases = [
        (["--text", "a cat", "--prompt", "what"], "--prompt goes with --image"),
        (["--image", str(picture), "--prompt", "  "], "--prompt is empty"),
        (["--image", str(picture), "--prompt", "what", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
        (["--image", str(picture), "--prompt", "what", "--head-fusion", "mean"], "apply to --image without --prompt"),
        (["--image", str(picture), "--prompt", "what", "--max-new-tokens", "1000000000"],
         "would pass the language model's 64 positions"),
    ]
    for extra, message in cases:
        assert main(["inspect", "--model", str(directory), "--out", str(tmp_path / "out"), *extra]) != 0
        assert message in capsys.readouterr().err
    assert main(["inspect", "--model", str(vit), "--image", str(picture), "--prompt", "what",
                 "--out", str(tmp_path / "out")]) != 0
    assert "needs a vision-language model" in capsys.readouterr().err
    assert main(["inspect", "--model", str(tmp_path / "nowhere"), "--image", str(picture), "--prompt", "what",
                 "--out", str(tmp_path / "out")]) != 0
    assert "is not one" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_image_on_a_vision_language_model_says_what_to_give(tmp_path, capsys):
    """Without --prompt, a laid-out family is told to give one; a vision-language family attnlab
    does not lay out (PaliGemma) is told so, with or without --prompt; nothing is written."""
    from attnlab.cli import main
    from attnlab.hf.census_models import shrink

    directory, _, _ = _directory(tmp_path, "llava")
    picture = tmp_path / "picture.png"
    _picture(40, 40).save(picture)
    paligemma = tmp_path / "paligemma"
    transformers.PaliGemmaForConditionalGeneration(shrink(transformers.PaliGemmaConfig())).save_pretrained(paligemma)
    assert main(["inspect", "--model", str(directory), "--image", str(picture), "--out", str(tmp_path / "o")]) != 0
    assert "is a vision-language model (llava): give --prompt" in capsys.readouterr().err
    for extra in ([], ["--prompt", "what"]):
        assert main(["inspect", "--model", str(paligemma), "--image", str(picture), "--out", str(tmp_path / "o"),
                     *extra]) != 0
        assert "(paligemma); attnlab lays out the image tokens of llava" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
