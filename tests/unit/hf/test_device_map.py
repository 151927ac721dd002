"""Models larger than a device: a Llama whose weights exceed the CPU budget it is given, the
rest offloaded to disk by accelerate, gives the same attention weights, statistics and logits
as the same model held whole; bad placements are refused in one line, in Python and on the
command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="device maps need the big extra")

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

import attnlab  # noqa: E402
import attnlab.hf as hf  # noqa: E402
from attnlab.cli import main  # noqa: E402
from attnlab.hf._kernel import BACKEND_NAME  # noqa: E402
from attnlab.hf.opening import TransformersModel, open_transformers  # noqa: E402
from attnlab.hf.placement import parse_max_memory, parse_size, placement  # noqa: E402

VOCABULARY = 100
TEXTS = ["w1 w4 w7 w10 w13", "w8 w11 w14 w17 w20 w23 w2", "w15 w18 w21", "w5 w9 w33 w40 w41 w60 w61 w62 w99"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> dict:
    """A random 4-layer Llama saved as transformers saves it (safetensors), with a tokenizer."""
    root = tmp_path_factory.mktemp("device_map")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCABULARY, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, architectures=["LlamaForCausalLM"],
    )
    directory = root / "llama"
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    words = Tokenizer(models.WordLevel({"[UNK]": 0, **{f"w{i}": i for i in range(1, VOCABULARY)}}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.save(str(directory / "tokenizer.json"))
    (root / "texts.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    weights = sum(path.stat().st_size for path in directory.glob("*.safetensors"))
    return {"root": root, "dir": directory, "bytes": weights, "texts": root / "texts.txt"}


@pytest.fixture(scope="module")
def opened(llama) -> dict:
    """The model held whole, and the same files opened within a CPU budget of a third of its weights."""
    budget = llama["bytes"] // 3
    offloaded = attnlab.load(llama["dir"], device_map="auto", max_memory={"cpu": budget},
                             offload_dir=llama["root"] / "offload", tokenizer=False).model
    return {"whole": open_transformers(llama["dir"]), "offloaded": offloaded, "budget": budget}


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, VOCABULARY, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding, as decoders pad
    return ids, mask


def test_the_budget_is_below_the_weights_and_layers_are_on_disk(llama, opened):
    model = opened["offloaded"]
    assert isinstance(model, TransformersModel)  # a Llama directory opens through transformers with a device map
    assert opened["budget"] < llama["bytes"]
    where = model.model.hf_device_map
    assert "disk" in where.values() and "cpu" in where.values()
    assert any(parameter.device.type == "meta" for parameter in model.parameters())  # not held in memory


def test_without_a_placement_a_llama_directory_opens_as_attnlabs_own_decoder(llama):
    model = attnlab.load(llama["dir"], tokenizer=False).model
    assert not isinstance(model, TransformersModel)


def test_recorded_weights_and_logits_equal_the_whole_models(opened):
    ids, mask = _batch()
    with torch.no_grad():
        with opened["whole"].record() as whole:
            whole_logits = opened["whole"](ids, mask).logits
        with opened["offloaded"].record(layers=["layer_1", "layer_2", "layer_3", "layer_4"]) as offloaded:
            offloaded_logits = opened["offloaded"](ids, mask).logits
    assert torch.allclose(offloaded_logits, whole_logits, atol=1e-6, rtol=0)
    assert offloaded.attentions.keys() == whole.attentions.keys() == ("layer_1", "layer_2", "layer_3", "layer_4")
    for name in whole.attentions.keys():
        weights = offloaded.attentions[name]
        assert weights.device.type == "cpu" and weights.shape == (2, 4, 9, 9)
        assert torch.allclose(weights, whole.attentions[name], atol=1e-6, rtol=0), name
    # and both are transformers' own eager weights
    inner = opened["whole"].model
    inner.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            eager = inner(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    finally:
        inner.set_attn_implementation(BACKEND_NAME)
    real = mask.bool()[:, None, :, None]  # eager spreads a padded query row over masked keys; attnlab zeroes it
    for index, name in enumerate(whole.attentions.keys()):
        assert torch.allclose(offloaded.attentions[name] * real, eager[index] * real, atol=1e-6, rtol=0)


def _close(first: dict, second: dict) -> None:
    assert first.keys() == second.keys()
    for layer in first:
        assert first[layer].keys() == second[layer].keys()
        for statistic, values in first[layer].items():
            assert values == pytest.approx(second[layer][statistic], abs=1e-6, nan_ok=True), (layer, statistic)


def test_statistics_equal_the_whole_models(opened):
    ids, mask = _batch()
    groups = {"first": [int(ids[0, 0])]}
    with torch.no_grad():
        with opened["whole"].statistics(token_groups=groups) as whole:
            opened["whole"](ids, mask)
        with opened["offloaded"].statistics(token_groups=groups) as offloaded:
            opened["offloaded"](ids, mask)
    assert set(offloaded.means()) == {"layer_1", "layer_2", "layer_3", "layer_4"}
    _close(offloaded.means(), whole.means())


def test_attach_serves_the_offloaded_transformers_model_itself(opened):
    ids, mask = _batch()
    whole, offloaded = opened["whole"].model, opened["offloaded"].model
    with torch.no_grad():
        with hf.attach(whole, layers="all") as seen_whole:
            whole(input_ids=ids, attention_mask=mask)
        with hf.attach(offloaded, layers="all") as seen_offloaded:
            offloaded(input_ids=ids, attention_mask=mask)
        with hf.attach(whole, statistics=True) as statistics_whole:
            whole(input_ids=ids, attention_mask=mask)
        with hf.attach(offloaded, statistics=True) as statistics_offloaded:
            offloaded(input_ids=ids, attention_mask=mask)
    assert len(seen_offloaded.attentions) == 4
    for name in seen_whole.attentions.keys():
        assert torch.allclose(seen_offloaded.attentions[name], seen_whole.attentions[name], atol=1e-6, rtol=0)
    _close(statistics_offloaded.statistics(), statistics_whole.statistics())


def test_sizes_are_read_in_decimal_and_binary_units():
    assert parse_size("300MB") == 300 * 10 ** 6
    assert parse_size("2GiB") == 2 * 2 ** 30
    assert parse_size("1.5gb") == 1_500_000_000
    assert parse_size(4096) == parse_size("4096") == 4096
    assert parse_max_memory("cpu=300MB, disk=1KiB") == {"cpu": 300 * 10 ** 6, "disk": 1024}
    assert parse_max_memory({"CPU": "2GiB"}) == {"cpu": 2 * 2 ** 30}
    assert placement() is None
    assert placement(max_memory={"cpu": "1GB"}).device_map == "auto"  # a budget alone means the auto map


@pytest.mark.parametrize("options, expected", [
    ({"max_memory": {"cpu": "300 megs"}}, "'300 megs' is not a size"),
    ({"max_memory": {"cpu": "-3MB"}}, "'-3MB' is not a size"),
    ({"max_memory": "cpu:300MB"}, "'cpu:300MB' is not DEVICE=SIZE"),
    ({"max_memory": {"gpu": "1GB"}}, "'gpu' is not a device"),
    ({"device_map": "everywhere"}, "device_map must be one of auto"),
    ({"device": "cpu", "device_map": "auto"}, "give one of them"),
    ({"device_map": {"model.layers": "disk"}}, "pass offload_dir"),
])
def test_bad_placements_are_refused_in_one_line_before_anything_is_read(llama, options, expected):
    with pytest.raises(ValueError) as error:
        attnlab.load(llama["dir"], tokenizer=False, **options)
    assert expected in str(error.value) and "\n" not in str(error.value)


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="names a GPU this machine lacks")
def test_a_budget_for_a_missing_gpu_is_refused(llama):
    with pytest.raises(ValueError, match="GPU 0 is not on this machine"):
        attnlab.load(llama["dir"], max_memory={0: "1GB", "cpu": "1GB"}, tokenizer=False)


def test_layers_spilled_to_disk_without_an_offload_dir_are_refused(llama):
    with pytest.raises(ValueError, match="but on disk: pass offload_dir"):
        attnlab.load(llama["dir"], max_memory={"cpu": llama["bytes"] // 3}, tokenizer=False)


def test_an_offload_dir_that_holds_files_is_refused_and_left_alone(llama, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my own file\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"is not empty \(notes.txt\).*never over files"):
        attnlab.load(llama["dir"], max_memory={"cpu": "10KB"}, offload_dir=mine, tokenizer=False)
    assert [path.name for path in mine.iterdir()] == ["notes.txt"]
    assert (mine / "notes.txt").read_text(encoding="utf-8") == "my own file\n"
    with pytest.raises(ValueError, match="is a file"):
        attnlab.load(llama["dir"], offload_dir=mine / "notes.txt", tokenizer=False)
    with pytest.raises(ValueError, match="lies under the file"):
        attnlab.load(llama["dir"], offload_dir=mine / "notes.txt" / "offload", tokenizer=False)


def test_attnlab_checkpoints_and_gguf_files_refuse_a_device_map(tmp_path, tiny_gguf):
    from attnlab import EncoderClassifier, TransformerEncoder

    encoder = TransformerEncoder(30, 16, 2, 2, 32, max_len=16)
    EncoderClassifier(encoder, 2).save_pretrained(tmp_path / "checkpoint")
    with pytest.raises(ValueError, match="is an attnlab checkpoint, which attnlab opens whole: leave them out"):
        attnlab.load(tmp_path / "checkpoint", device_map="auto")
    with pytest.raises(ValueError, match="is a GGUF file, which attnlab opens whole"):
        attnlab.load(tiny_gguf, max_memory={"cpu": "1GB"})


def test_a_missing_accelerate_names_the_extra(llama, monkeypatch):
    monkeypatch.setitem(sys.modules, "accelerate", None)  # import accelerate raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'attnlab\[big\]'"):
        attnlab.load(llama["dir"], device_map="auto")


# -- the command line -----------------------------------------------------------------------
def _run(argv: list[str], capsys) -> tuple[int, list[str]]:
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse
        code = stop.code
    progress = "Loading weights"  # transformers' own progress bar while it reads the weights
    err = capsys.readouterr().err
    return code, [line for line in err.replace("\r", "\n").splitlines() if line.strip() and progress not in line]


def test_analyze_with_layers_on_disk_writes_the_whole_models_statistics(llama, tmp_path, capsys):
    common = ["analyze", "--model", str(llama["dir"]), "--data", str(llama["texts"]), "--no-progress",
              "--max-length", "16", "--batch-size", "2"]
    assert main([*common, "--out", str(tmp_path / "whole")]) == 0
    offload = tmp_path / "offload"
    assert main([*common, "--out", str(tmp_path / "placed"), "--device-map", "auto", "--max-memory",
                 f"cpu={llama['bytes'] // 3}B", "--offload-dir", str(offload)]) == 0
    printed = capsys.readouterr().out
    assert "through transformers" in printed and "on disk" in printed
    whole = json.loads((tmp_path / "whole" / "statistics.json").read_text())
    placed = json.loads((tmp_path / "placed" / "statistics.json").read_text())
    assert placed["tokens"] == whole["tokens"] and placed["layers"] == whole["layers"]
    _close(placed["statistics"], whole["statistics"])


def test_every_command_that_loads_a_model_takes_the_placement_options():
    from attnlab.cli import SUBCOMMANDS, build_parser

    parser = build_parser()
    loading = [name for name in SUBCOMMANDS if name not in ("demo", "train", "image-attention")]
    for name in loading:
        help_text = parser._subparsers._group_actions[0].choices[name].format_help()
        assert "--device-map" in help_text and "--max-memory" in help_text and "--offload-dir" in help_text, name
        assert "cpu=300MB" in help_text, name


def test_bad_placements_on_the_command_line_are_one_line(llama, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my own file\n", encoding="utf-8")
    from attnlab import EncoderClassifier, TransformerEncoder

    EncoderClassifier(TransformerEncoder(30, 16, 2, 2, 32, max_len=16), 2).save_pretrained(tmp_path / "checkpoint")
    model = ["--model", str(llama["dir"])]
    cases = [
        (["inspect", *model, "--text", "w1 w2", "--max-memory", "cpu=lots"], "--max-memory for 'cpu': 'lots'"),
        (["analyze", *model, "--data", str(llama["texts"]), "--max-memory", "cpu:3GB"], "is not DEVICE=SIZE"),
        (["inspect", *model, "--text", "w1 w2", "--device-map", "everywhere"], "invalid choice"),
        (["inspect", *model, "--text", "w1 w2", "--offload-dir", str(mine)], "--offload-dir"),
        (["inspect", *model, "--text", "w1 w2", "--max-memory", "cpu=10KB"],
         "the whole model but on disk: pass --offload-dir"),
        (["inspect", *model, "--text", "w1 w2", "--max-memory", f"cpu={llama['bytes'] // 3}"],
         "but on disk: pass --offload-dir"),
        (["inspect", "--model", str(tmp_path / "checkpoint"), "--text", "w1 w2", "--device-map", "auto"],
         "is an attnlab checkpoint"),
    ]
    failures = []
    for argv, expected in cases:
        code, lines = _run([*argv, "--out", str(tmp_path / "never-written")], capsys)
        if code != 2 or len(lines) != 1 or expected not in lines[0]:
            failures.append(f"{' '.join(argv)} -> exit {code}, stderr {lines!r}")
    assert not failures, "\n".join(failures)
    assert (mine / "notes.txt").read_text(encoding="utf-8") == "my own file\n"
