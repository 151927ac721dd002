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


def test_a_module_imported_by_its_old_path_keeps_its_own_spec() -> None:
    """Its relative imports inside functions resolve against its spec, as they did before."""
    old = importlib.import_module("attnlab.attention.sparse._kernel_choice")
    assert old is importlib.import_module("attnlab._dispatch")
    assert old.__spec__.name == old.__name__ == "attnlab._dispatch"
    assert old.__spec__.parent == old.__package__
