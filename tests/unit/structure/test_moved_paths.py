"""Old import paths keep working after a module or a name moved (``attnlab._moved``)."""

from __future__ import annotations

import importlib

import pytest

import attnlab
from attnlab import _moved


def test_the_encoder_model_moved_to_models_and_its_layer_stayed_in_layers() -> None:
    from attnlab.layers import EncoderLayerOutput, EncoderOutput, TransformerEncoder, TransformerEncoderLayer
    from attnlab.layers.encoder import find_encoder
    from attnlab.models.encoder import TransformerEncoder as moved

    assert TransformerEncoder is moved is attnlab.TransformerEncoder
    assert TransformerEncoder.__module__ == "attnlab.models.encoder"
    assert EncoderOutput.__module__ == "attnlab.models.encoder"
    assert TransformerEncoderLayer.__module__ == EncoderLayerOutput.__module__ == "attnlab.layers.encoder_layer"
    assert find_encoder is attnlab.models.find_encoder


def test_an_old_module_path_is_the_new_module_itself() -> None:
    old = importlib.import_module("attnlab.layers.encoder")
    assert old is importlib.import_module("attnlab.models.encoder")
    assert attnlab.layers.encoder is old
    assert old.TransformerEncoderLayer is attnlab.TransformerEncoderLayer


def test_the_longest_old_path_decides() -> None:
    assert _moved.new_name("attnlab.models.families._convert") == "attnlab.checkpoints._convert"
    assert _moved.new_name("attnlab.models.families.bert") == "attnlab.checkpoints.encoders.bert"
    assert _moved.new_name("attnlab.layers.encoder_config") is None
    assert _moved.new_name("attnlab.layers.encoder") == "attnlab.models.encoder"


def test_a_name_that_never_was_there_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchLayer'"):
        attnlab.layers.NoSuchLayer  # noqa: B018


def test_config_readers_that_moved_to_source_keep_their_old_names() -> None:
    from attnlab.checkpoints import source
    from attnlab.checkpoints.attnlab_layout import find_checkpoint_dir
    from attnlab.checkpoints.encoders.loading import pretrained_width

    assert find_checkpoint_dir is source.find_checkpoint_dir
    assert pretrained_width is source.pretrained_width


@pytest.mark.parametrize("old, new", [
    ("attnlab.demo", "attnlab.cli.demo"),
    ("attnlab._command_errors", "attnlab.cli._errors"),
    ("attnlab.train.command", "attnlab.cli.train"),
    ("attnlab.serve.command", "attnlab.cli.serve"),
    ("attnlab.inspect.commands.inspect_command", "attnlab.cli.inspect"),
    ("attnlab.inspect.commands.image_attention_command", "attnlab.cli.image_attention"),
    ("attnlab.inspect.commands", "attnlab.workflows"),
    ("attnlab.inspect.commands.explain_text", "attnlab.workflows.explain_text"),
    ("attnlab.inspect.commands.resolve", "attnlab.workflows.resolve"),
    ("attnlab.hf.image_preprocessing", "attnlab.data.images"),
])
def test_the_command_line_workflows_and_readers_keep_their_old_paths(old: str, new: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(new)


def test_names_that_left_their_module_keep_their_old_paths() -> None:
    from attnlab.cli import _model_options
    from attnlab.data import audio, images
    from attnlab.hf.audio import read_wav
    from attnlab.hf.vision import load_image
    from attnlab.inspect import Comparison, explain, explain_generation
    from attnlab.inspect.commands.image_attention_command import draw_examples
    from attnlab.inspect.commands.resolve import add_dtype_argument, resolve_model
    from attnlab.workflows import compare_models, explain_generation as generation, explain_text, image_attention, resolve

    assert load_image is images.load_image and read_wav is audio.read_wav
    assert explain is explain_text.explain and Comparison is compare_models.Comparison
    assert explain_generation is generation.explain_generation
    assert draw_examples is image_attention.draw_examples
    assert add_dtype_argument is _model_options.add_dtype_argument and resolve_model is resolve.resolve_model


def test_python_m_an_old_path_runs_the_module_at_its_new_path() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    source = str(Path(attnlab.__file__).resolve().parents[1])
    result = subprocess.run([sys.executable, "-m", "attnlab.demo", "--help"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": source}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m attnlab.cli.demo")


def test_the_data_readers_load_no_image_library_on_import() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    source = str(Path(attnlab.__file__).resolve().parents[1])
    code = "import sys, attnlab.data, attnlab.data.images, attnlab.data.audio; print('PIL' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": source}, timeout=120)
    assert result.stdout.strip() == "False", result.stderr
def test_a_module_imported_by_its_old_path_keeps_its_own_spec() -> None:
    """Its relative imports inside functions resolve against its spec, as they did before."""
    old = importlib.import_module("attnlab.attention.sparse._kernel_choice")
    assert old is importlib.import_module("attnlab._dispatch")
    assert old.__spec__.name == old.__name__ == "attnlab._dispatch"
    assert old.__spec__.parent == old.__package__
