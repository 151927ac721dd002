"""Open a directory that attnlab does not re-implement through transformers.

Dimension letters: ``B`` batch, ``T`` length.

A HuggingFace directory whose ``model_type`` is none of attnlab's families (Gemma 3,
Qwen3, Phi, T5, ViT, ...) opens with the ``transformers`` class its config names
(``architectures[0]``, else ``AutoModel``), sharded and bfloat16 checkpoints included,
and runs attnlab's attention function for as long as it lives:
:class:`TransformersModel` is called as attnlab's models are (``model(input_ids,
mask=...)``), and attnlab's inspection tools (``capture_attention``, the analyzer,
``mask_heads``, the explain methods) find its attention modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import torch
from torch import Tensor, nn

from ..inspect.compute.capture import serve_as_attention
from ._kernel import BACKEND_NAME, use_eager_masks, register
from .backend import _configs_of
from ._sites import attention_sites, unrouted_attention

if TYPE_CHECKING:
    from ..checkpoints.source import Source

__all__ = ["TransformersModel", "open_transformers", "is_transformers_only"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def is_transformers_only(source: Union[str, Path, "Source"]) -> bool:
    """Whether ``source`` (a path, or what :func:`~attnlab.checkpoints.source.open_source`
    found there) is a HuggingFace checkpoint of a ``model_type`` attnlab does not
    re-implement (attnlab's own families and decoders keep their faster path)."""
    from ..checkpoints.source import open_source

    if isinstance(source, (str, Path)):
        if not Path(source).is_dir():
            return False
        try:
            source = open_source(source)
        except (OSError, ValueError):
            return False  # the loader says what is wrong with it
    model_type = (source.config or {}).get("model_type")
    return (source.format == "huggingface" and source.gguf is None and isinstance(model_type, str)
            and not source.is_decoder and source.family is None)


class TransformersModel(nn.Module):
    """A transformers model served by attnlab's attention function, called as attnlab's models.

    Attributes:
        model: the transformers model (``attn_implementation="attnlab"``: the fused kernel
            unless weights are asked for, exact per-head weights when they are).
        name: where it came from.
    """

    def __init__(self, model: nn.Module, name: str = "model") -> None:
        super().__init__()
        unrouted = unrouted_attention(model)
        if unrouted:
            raise ValueError(
                f"{name}: {unrouted[0]} computes attention without transformers' AttentionInterface; "
                f"attnlab cannot show its weights"
            )
        register()
        use_eager_masks(model, _configs_of(model))
        model.set_attn_implementation(BACKEND_NAME)
        self.model, self.name = model, name
        self.config = model.config
        self.sites = attention_sites(model)
        serve_as_attention({site.module: site.heads for site in self.sites})  # for the model's lifetime
        labels = getattr(model.config, "id2label", None) or {}
        self.label_names = [str(labels[index]) for index in sorted(labels)] if len(labels) > 1 else None

    @property
    def is_causal(self) -> bool:
        return any(getattr(site.module, "is_causal", False) for site in self.sites if not site.cross)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def forward(self, input_ids: Tensor, mask: Optional[Tensor] = None, **kwargs: Any) -> Any:
        return self.model(input_ids=input_ids, attention_mask=None if mask is None else mask.long(), **kwargs)

    def __repr__(self) -> str:
        return f"TransformersModel({type(self.model).__name__} from {self.name}, served by attnlab's attention)"


def open_transformers(directory: Union[str, Path], *, dtype: str = "float32") -> TransformersModel:
    """Open ``directory`` with transformers (the class its config names) under attnlab's attention.

    Args:
        directory: a HuggingFace directory (``config.json`` and safetensors, sharded or not).
        dtype: ``float32``, ``bfloat16``, ``float16`` or ``auto`` (the checkpoint's own).

    Raises:
        ImportError: transformers is not installed (the message names the extra).
        ValueError: ``dtype`` is not one of those, or the architecture is unknown to transformers.
    """
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            "opening a model attnlab does not re-implement needs transformers: pip install 'attnlab[hf]'"
        ) from error
    if dtype != "auto" and dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join([*_DTYPES, 'auto'])}, got {dtype!r}")
    try:
        config = transformers.AutoConfig.from_pretrained(directory)
    except (ValueError, KeyError) as error:
        model_type = str(error).split("model type `", 1)[-1].split("`", 1)[0] if "model type `" in str(error) else "?"
        raise ValueError(
            f"{directory}: model_type {model_type!r} is neither one attnlab re-implements nor one transformers "
            f"{transformers.__version__} knows"
        ) from None
    architectures = getattr(config, "architectures", None) or []
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    if model_class is None:
        model_class = transformers.AutoModel
    _check_weight_files(directory, model_class, config)
    try:
        model = model_class.from_pretrained(
            directory, dtype="auto" if dtype == "auto" else _DTYPES[dtype], attn_implementation="sdpa"
        )
    except OSError as error:  # transformers' word for missing or unreadable weight files
        raise ValueError(f"{directory}: {str(error).splitlines()[0]}") from None
    except RuntimeError as error:  # sizes the check above could not compare (renamed keys)
        if "ignore_mismatched_sizes" not in str(error):
            raise
        raise ValueError(f"{directory}: config.json's sizes do not match the weights (transformers' report above); "
                         f"the config and the weights come from different models") from None
    opened = TransformersModel(model.eval(), name=str(directory))
    try:
        embedding = opened.get_input_embeddings()
    except (NotImplementedError, AttributeError):  # a model with no token embedding (images, audio)
        embedding = None
    if isinstance(embedding, nn.Embedding):
        embedding.register_forward_pre_hook(_vocabulary_check(str(directory)))
    return opened


def _check_weight_files(directory: Union[str, Path], model_class: Any, config: Any) -> None:
    """One line for a damaged weight file, or a ``config.json`` whose sizes contradict the
    weights, before transformers loads anything (it would print a report, then raise).

    Reads the safetensors headers only, and the shapes of the model the config builds on
    the meta device (no memory). A checkpoint whose keys transformers renames on loading
    is compared where the names agree.
    """
    from safetensors import SafetensorError, safe_open

    files = sorted(Path(directory).glob("*.safetensors"))
    stored: dict[str, tuple[tuple[int, ...], str]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as opened:
                for key in opened.keys():
                    stored[key] = (tuple(opened.get_slice(key).get_shape()), file.name)
        except (SafetensorError, OSError) as error:
            raise ValueError(f"{file}: not a readable safetensors file ({error}); it is damaged or truncated: "
                             f"copy or save it again") from None
    if not stored:
        return
    try:
        with torch.device("meta"):
            expected = {name: tuple(tensor.shape) for name, tensor in model_class(config).state_dict().items()}
    except Exception:  # a class that cannot be built on the meta device: transformers' own check serves
        return
    for key, (shape, file) in stored.items():
        if key in expected and expected[key] != shape:
            raise ValueError(f"{directory}: {key} is {list(shape)} in {file} but config.json makes it "
                             f"{list(expected[key])}: the config and the weights come from different models")


def _vocabulary_check(name: str):
    """A pre-hook on the input embedding: one line for a token id past the model's vocabulary
    (the tokenizer belongs to another model) instead of an ``IndexError`` deep in the forward."""

    def check(module: nn.Module, args: tuple) -> None:
        ids = args[0] if args else None
        if isinstance(ids, Tensor) and ids.numel() and not ids.is_floating_point():
            largest = int(ids.max())
            if largest >= module.num_embeddings or int(ids.min()) < 0:
                bad = largest if largest >= module.num_embeddings else int(ids.min())
                raise ValueError(f"token id {bad} lies outside {name}'s vocabulary of {module.num_embeddings} "
                                 f"(ids 0..{module.num_embeddings - 1}): its tokenizer and its model differ; "
                                 f"put the model's own tokenizer.json beside it")

    return check
