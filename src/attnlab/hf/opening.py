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

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from ..attention.interface import serve_as_attention
from ..inspect.compute.query_rows import RowChoice
from ..inspect.compute.inspectable import (HeadMask, Site, residual_blocks, shared_reason, sliding_window,
                                          special_ids_of)
from ..inspect.compute.site_statistics import SiteStatistics
from ._kernel import BACKEND_NAME, use_eager_masks, register
from .backend import AttachedModel, _configs_of, attach, scale_heads
from ._sites import attention_sites, unrouted_attention, window_of
from .seq2seq import decoder_start

if TYPE_CHECKING:
    from ..checkpoints.source import Source
    from .placement import Placement

__all__ = ["TransformersModel", "as_inspectable", "gguf_tokenizer", "open_transformers", "is_transformers_only",
           "transformers_module"]

DECODER_INPUT = ("each text itself, shifted right after the decoder start token (teacher forcing): the decoder "
                 "and cross statistics describe the model reading the text as its own target")
# The base model's final norm, by the names transformers' families give it.
_NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_layer_norm")

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
    if source.gguf is not None:  # attnlab re-implements the Llama family; transformers' GGUF reader the rest
        from ..checkpoints.gguf.header import gguf_architecture

        return gguf_architecture(source.gguf) != "llama"
    model_type = (source.config or {}).get("model_type")
    return (source.format == "huggingface" and isinstance(model_type, str)
            and not source.is_decoder and source.family is None)


class TransformersModel(nn.Module):
    """A transformers model served by attnlab's attention function, called as attnlab's models.

    It offers what every model offers to be looked inside
    (:class:`~attnlab.inspect.compute.inspectable.Inspectable`): its sites, weights recorded
    on chosen layers, statistics block by block, head interventions, embeddings, the readout
    and generation, each through attnlab's attention function (:func:`~attnlab.hf.attach`).

    Attributes:
        model: the transformers model (``attn_implementation="attnlab"``: the fused kernel
            unless weights are asked for, exact per-head weights when they are).
        name: where it came from.
        kind: ``"decoder"``, ``"encoder"``, ``"encoder-decoder"``, ``"vision"``, ``"speech"``
            or ``"vision-language"``.
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
        # every config has an id2label (LABEL_0, LABEL_1 by default): names only for a classification head
        classifies = "Classification" in type(model).__name__
        self.label_names = [str(labels[index]) for index in sorted(labels)] if classifies and len(labels) > 1 else None
        self.kind = _kind(model.config, self.is_causal)
        self.architecture = type(model).__name__
        self.special_ids = special_ids_of(model.config)
        # what an encoder-decoder's decoder reads when the caller gives it nothing
        self.decoder_input = DECODER_INPUT if self.kind == "encoder-decoder" else None

    @property
    def is_causal(self) -> bool:
        return any(getattr(site.module, "is_causal", False) for site in self.sites if not site.cross)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    # -- the inspection protocol ---------------------------------------------------------
    def attention_sites(self) -> list[Site]:
        return [Site(site.name, site.path, site.module, site.heads, site.cross,
                     bool(getattr(site.module, "is_causal", False)) and not site.cross,
                     None if site.cross else window_of(site.module, self.config)) for site in self.sites]

    def unsupported(self, feature: str) -> Optional[str]:
        name = self.architecture
        if feature == "one_sequence" and self.kind == "encoder-decoder":
            return (f"{name} is an encoder-decoder model (encoder, decoder and cross-attention over two texts): its "
                    f"layers share no token axis; attnlab inspect --source/--target and align read it")
        if feature == "input_embeddings":
            return None if isinstance(self._embedding(), nn.Embedding) else f"{name} has no token embedding"
        if feature == "readout":
            return None if self._readout_parts() is not None else (
                f"{name}: no final norm ({', '.join(_NORM_NAMES)}) and language-model head found; the logit lens "
                f"needs a decoder-only language model")
        if feature == "generate":
            if self.kind != "decoder" or not callable(getattr(self.model, "generate", None)):
                return f"{name} is a{'n' if self.kind[0] in 'aeiou' else ''} {self.kind} model; generation with " \
                       f"attention takes decoder-only language models"
            return None
        return shared_reason(self, feature)

    def record(self, *, layers: Optional[Sequence[str]] = None, grad: bool = False,
               rows: RowChoice = None) -> "contextlib.AbstractContextManager[AttachedModel]":
        """:func:`~attnlab.hf.attach` with exact weights on ``layers`` (default all), of the
        query rows ``rows`` (default all); the cross-attention layers' weights are in
        ``.cross_attentions``."""
        return attach(self.model, layers="all" if layers is None else list(layers), grad=grad, rows=rows)

    @contextlib.contextmanager
    def statistics(self, *, sparsity_threshold: float = 0.1, top_k: int = 3,
                   token_groups: Optional[Mapping[str, Iterable[int]]] = None) -> Iterator[SiteStatistics]:
        """Statistics block by block inside attnlab's attention function: no map is kept."""
        with attach(self.model, statistics=True, sparsity_threshold=sparsity_threshold, top_k=top_k,
                    token_groups=token_groups) as seen:
            seen.recorder.window = sliding_window(self.attention_sites())
            yield seen.recorder

    def intervene(self, *, head_mask: HeadMask) -> "contextlib.AbstractContextManager[Tensor]":
        """Each head's weights and output multiplied by ``head_mask`` before the output
        projection, by attnlab's attention function (:func:`~attnlab.hf.backend.scale_heads`)."""
        return scale_heads(self.model, self.sites, head_mask)

    @contextlib.contextmanager
    def head_outputs(self, layers: Sequence[str], *,
                     replace: Optional[Mapping[str, tuple[Tensor, Tensor]]] = None) -> Iterator[dict[str, Tensor]]:
        """attnlab's attention function records (and replaces) each head's output ``[B, T, H, D]``
        as it returns it, before the module's output projection."""
        with attach(self.model) as seen:
            yield seen.watch_head_outputs(layers, replace)

    def blocks(self) -> list[tuple[str, nn.Module]]:
        return residual_blocks(self.model, self.attention_sites())

    def _embedding(self) -> Optional[nn.Module]:
        """The token embedding, or ``None`` (a model with none raises in transformers)."""
        try:
            return self.model.get_input_embeddings()
        except (NotImplementedError, AttributeError):
            return None

    def input_embeddings(self) -> nn.Module:
        embedding = self._embedding()
        if not isinstance(embedding, nn.Embedding):
            raise ValueError(f"input_embeddings: {self.unsupported('input_embeddings')}")
        return embedding

    def _readout_parts(self) -> Optional[tuple[nn.Module, nn.Module]]:
        get_head = getattr(self.model, "get_output_embeddings", None)
        head = get_head() if callable(get_head) and self.kind == "decoder" else None
        base = getattr(self.model, "base_model", None)
        norm = next((getattr(base, name) for name in _NORM_NAMES if isinstance(getattr(base, name, None), nn.Module)),
                    None)
        return None if head is None or norm is None else (norm, head)

    def readout(self) -> Callable[[Tensor], Tensor]:
        """``hidden -> logits``: the base model's final norm, the LM head, and the config's
        ``final_logit_softcapping`` where it has one (Gemma)."""
        parts = self._readout_parts()
        if parts is None:
            raise ValueError(f"readout: {self.unsupported('readout')}")
        norm, head = parts
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap:
            return lambda hidden: torch.tanh(head(norm(hidden)) / cap) * cap
        return lambda hidden: head(norm(hidden))

    def generate(self, input_ids: Tensor, *, attention_mask: Optional[Tensor] = None, max_new_tokens: int = 20,
                 **options: Any) -> Any:
        """:func:`attnlab.hf.generate`: transformers' ``generate``, every step's attention
        recorded (``output_attentions=False``: none recorded, and greedy generation runs
        attnlab's native decoding step where it serves, :meth:`unserved_reason`).
        ``options`` are attnlab's (``do_sample``, ``temperature``, ``top_k``, ``top_p``,
        ``seed``, ``eos_token_id``, ``pad_token_id``); ``compile`` serves attnlab's own
        decoders only."""
        from .generation import generate

        reason = self.unsupported("generate")
        if reason is not None:
            raise ValueError(f"generate: {reason}")
        options = {key: value for key, value in options.items() if value is not None}
        output_attentions = options.pop("output_attentions", True)  # recorded unless asked not to
        if options.pop("compile", False):
            raise ValueError("--compile applies to attnlab's own decoders, not to models opened through transformers")
        seed = options.pop("seed", None)
        if seed is not None:
            torch.manual_seed(seed)
        return generate(self.model, input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                        output_attentions=output_attentions, **options)

    def unserved_reason(self, batch: int = 1, **options: Any) -> Optional[str]:
        """``None`` where attnlab's native decoding step serves ``generate`` of ``batch`` rows
        with these ``options``, else why transformers' ``generate`` runs
        (:func:`attnlab.hf.native_decoding.unserved_reason`)."""
        from .native_decoding import unserved_reason

        return unserved_reason(self.model, batch, **options)

    def forward(self, input_ids: Optional[Tensor] = None, mask: Optional[Tensor] = None, **kwargs: Any) -> Any:
        """``model(input_ids=, attention_mask=)``; an encoder-decoder given no decoder input
        reads each text as its own target (:attr:`decoder_input`)."""
        if mask is None:  # the tokenizer's name for it: model(**tokenizer(texts, return_tensors="pt"))
            mask = kwargs.pop("attention_mask", None)
        attention_mask = None if mask is None else mask.long()
        if input_ids is None:  # the model's own keyword inputs (pixel_values, input_features, ...)
            return self.model(**({"attention_mask": attention_mask} if attention_mask is not None else {}), **kwargs)
        reads = getattr(self.model, "main_input_name", "input_ids")
        if reads != "input_ids" and self.kind != "encoder-decoder":
            raise ValueError(f"{type(self.model).__name__} reads {reads}, not token ids: give it {reads}=... "
                             f"(attnlab's commands: --image for images, --audio for speech)")
        if self.decoder_input is not None and "decoder_input_ids" not in kwargs and "labels" not in kwargs:
            start = torch.full_like(input_ids[:, :1], decoder_start(self.model))
            kwargs["decoder_input_ids"] = torch.cat([start, input_ids[:, :-1]], 1)
            if attention_mask is not None:
                kwargs["decoder_attention_mask"] = torch.cat([torch.ones_like(attention_mask[:, :1]),
                                                              attention_mask[:, :-1]], 1)
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    def __repr__(self) -> str:
        return f"TransformersModel({type(self.model).__name__} from {self.name}, served by attnlab's attention)"


def _kind(config: Any, causal: bool) -> str:
    """What kind of model ``config`` builds (the feature matrix's columns)."""
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    if hasattr(config, "vision_config") and hasattr(config, "text_config"):
        return "vision-language"
    if getattr(config, "num_mel_bins", None):
        return "speech"
    if causal:
        return "decoder"
    if getattr(config, "vocab_size", None) is None and (hasattr(config, "patch_size") or hasattr(config, "image_size")):
        return "vision"
    return "encoder"


def transformers_module(model: nn.Module) -> nn.Module:
    """The transformers model itself: the one a :class:`TransformersModel` serves, or ``model``."""
    return model.model if isinstance(model, TransformersModel) else model


def as_inspectable(model: nn.Module) -> TransformersModel:
    """A transformers model as :class:`~attnlab.inspect.compute.inspectable.Inspectable`:
    wrapped in a :class:`TransformersModel`, its attention served by attnlab's function
    from now on (``model.set_attn_implementation("sdpa")`` gives transformers' back)."""
    return TransformersModel(model, name=type(model).__name__)


def open_transformers(directory: Union[str, Path], *, dtype: str = "float32",
                      placement: Optional["Placement"] = None, gguf_file: Optional[str] = None) -> TransformersModel:
    """Open ``directory`` with transformers (the class its config names) under attnlab's attention.

    Args:
        directory: a HuggingFace directory (``config.json`` and safetensors, sharded or not),
            or the folder of ``gguf_file``.
        gguf_file: a GGUF file in ``directory`` of an architecture transformers' GGUF reader
            knows (Gemma 3, Qwen3, Phi-3, ...): a language model, dequantised to ``dtype``.
        dtype: ``float32``, ``bfloat16``, ``float16`` or ``auto`` (the checkpoint's own).
        placement: accelerate's device map, memory budgets and offload folder
            (:func:`~attnlab.hf.placement.placement`); ``None``: the whole model on the CPU.
            Offloaded layers are brought in for their own forward, and attnlab's attention
            function serves each layer on the device it runs on.

    Raises:
        ImportError: transformers is not installed (the message names the extra).
        ValueError: ``dtype`` is not one of those, the architecture is unknown to transformers,
            or the device map put layers on disk and ``placement`` has no offload folder.
    """
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            "opening a model attnlab does not re-implement needs transformers: pip install 'attnlab[hf]'"
        ) from error
    if dtype != "auto" and dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join([*_DTYPES, 'auto'])}, got {dtype!r}")
    if gguf_file is not None:
        name = str(Path(directory) / gguf_file)
        model = _read_gguf(transformers, Path(name), dtype)
    else:
        name = str(directory)
        model = _read_directory(transformers, directory, dtype, placement)
    opened = TransformersModel(model.eval(), name=name)
    embedding = opened._embedding()  # None for a model with no token embedding (images, audio)
    if isinstance(embedding, nn.Embedding):
        embedding.register_forward_pre_hook(_vocabulary_check(opened.name))
    return opened


def _with_fused_attention(from_pretrained: Any, *args: Any, **options: Any) -> nn.Module:
    """``from_pretrained`` with transformers' sdpa attention, or its eager one for a class
    that refuses sdpa (Gemma 2): the implementation the model keeps where attnlab's
    attention function is not attached."""
    try:
        return from_pretrained(*args, attn_implementation="sdpa", **options)
    except ValueError as error:
        if "does not support an attention implementation through" not in str(error):
            raise
        return from_pretrained(*args, attn_implementation="eager", **options)


def _read_directory(transformers: Any, directory: Union[str, Path], dtype: str,
                    placement: Optional["Placement"]) -> nn.Module:
    """The transformers model of a HuggingFace directory (the class its config names), placed."""
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
    placed = {} if placement is None else placement.from_pretrained_options()
    try:
        model = _with_fused_attention(model_class.from_pretrained, directory,
                                      dtype="auto" if dtype == "auto" else _DTYPES[dtype], **placed)
    except OSError as error:  # transformers' word for missing or unreadable weight files
        raise ValueError(f"{directory}: {str(error).splitlines()[0]}") from None
    except RuntimeError as error:  # sizes the check above could not compare (renamed keys)
        if "ignore_mismatched_sizes" not in str(error):
            raise
        raise ValueError(f"{directory}: config.json's sizes do not match the weights (transformers' report above); "
                         f"the config and the weights come from different models") from None
    if placement is not None:
        placement.check_dispatched(model)
    return model


def _read_gguf(transformers: Any, path: Path, dtype: str) -> nn.Module:
    """A GGUF language model through transformers' GGUF reader (its own dequantisation)."""
    try:
        model = _with_fused_attention(transformers.AutoModelForCausalLM.from_pretrained, path.parent,
                                      gguf_file=path.name,
                                      dtype=torch.float32 if dtype == "auto" else _DTYPES[dtype])
    except (ValueError, KeyError, ImportError) as error:
        raise ValueError(f"{path}: transformers {transformers.__version__} cannot read this GGUF file "
                         f"({str(error).splitlines()[0]})") from None
    return model


def gguf_tokenizer(path: Union[str, Path]) -> Any:
    """The ``tokenizers.Tokenizer`` transformers builds from a GGUF file's metadata
    (SentencePiece or byte-level BPE), with its special tokens (Gemma's ``<bos>``)."""
    import transformers

    path = Path(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    backend = tokenizer.backend_tokenizer
    backend.no_padding()
    backend.no_truncation()
    return backend


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
