"""Every article name imports from ``attnlab`` and every subpackage is an attribute."""

from __future__ import annotations

import importlib
import types

import attnlab

ARTICLE_NAMES = [
    "ScaledDotProductAttention", "MultiHeadAttention", "PositionWiseFFN", "TransformerEncoderLayer",
    "PositionalEncoding", "TransformerEncoder", "SparseAttention", "CrossModalAttention",
    "TransformerTrainer", "AttentionAnalyzer",
]
SUBPACKAGES = ["attention", "layers", "models", "data", "train", "inspect", "outputs"]


def test_every_article_class_imports_from_the_top() -> None:
    for name in ARTICLE_NAMES:
        assert isinstance(getattr(attnlab, name), type), name
        assert name in attnlab.__all__


def test_every_subpackage_is_an_attribute_and_is_not_shadowed() -> None:
    for name in SUBPACKAGES:
        module = getattr(attnlab, name)
        assert isinstance(module, types.ModuleType), f"attnlab.{name} is {type(module).__name__}"
        assert module is importlib.import_module(f"attnlab.{name}")
    assert attnlab.attention.MultiHeadAttention is attnlab.MultiHeadAttention
    assert callable(attnlab.attention.attention)


def test_all_names_exist() -> None:
    missing = [name for name in attnlab.__all__ if not hasattr(attnlab, name)]
    assert not missing
