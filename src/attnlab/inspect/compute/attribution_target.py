"""What an explanation explains: the pooled position and the class whose logit is traced.

Dimension letters: ``B`` batch, ``T`` length, ``C`` classes.

Attention-based scores read the attention *of the pooled position*: the first token
(``[CLS]``) for first-token pooling and for a bare encoder, the mean of every real
token's row for mean pooling (:class:`~attnlab.models.classifier.EncoderClassifier`'s
default), or the last real token for a causal decoder (the position that predicts the
next token: in a causal model row 0 can attend only to itself). :func:`query_weights`
says how much each query position weighs in that pooled row, so every method reads it
the same way.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from ...models.encoder import TransformerEncoder, find_encoder

__all__ = ["encoder_of", "is_causal_model", "token_embedding_of", "pooling_of", "query_weights", "logits_of",
           "resolve_target"]


def encoder_of(model: nn.Module) -> TransformerEncoder:
    """The :class:`~attnlab.TransformerEncoder` inside ``model`` (or ``model`` itself)."""
    encoder = find_encoder(model)
    if encoder is not None:
        return encoder
    raise TypeError(
        f"{type(model).__name__} has no attnlab TransformerEncoder (as .encoder); attribution "
        f"needs an attnlab encoder or a model built on one, such as EncoderClassifier"
    )


def token_embedding_of(model: nn.Module) -> tuple[nn.Module, Optional[int]]:
    """The token embedding of ``model``
    (:meth:`~attnlab.inspect.compute.inspectable.Inspectable.input_embeddings`) and its padding
    id: an attnlab encoder's ``config.pad_id``, else ``config.pad_token_id``."""
    from .inspectable import inspectable, require

    view = inspectable(model)
    require(view, "input_embeddings", "integrated gradients")
    encoder = find_encoder(model)
    pad_id = encoder.config.pad_id if encoder is not None else getattr(getattr(model, "config", None),
                                                                        "pad_token_id", None)
    return view.input_embeddings(), pad_id


def is_causal_model(model: nn.Module) -> bool:
    """Whether ``model`` is a causal (decoder-only) language model, whose positions see only their past."""
    if getattr(model, "model_type", None) == "decoder":  # attnlab's DecoderForCausalLM
        return True
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):  # its decoder is causal, its encoder is not
        return False
    if getattr(model, "is_causal", None) is True:  # a transformers model opened by attnlab.hf
        return True
    return bool(getattr(config, "is_decoder", False)) or type(model).__name__.endswith("ForCausalLM")


def pooling_of(model: nn.Module) -> str:
    """``"first"``, ``"mean"`` or ``"last"``: how ``model`` pools tokens.

    ``"first"`` for a bare encoder; ``"last"`` (the last real token, which predicts the
    next one) for a causal decoder.
    """
    if is_causal_model(model):
        return "last"
    pooling = getattr(model, "pooling", "first")
    return pooling if pooling in ("first", "mean") else "first"


def query_weights(model: nn.Module, mask: Tensor) -> Tensor:
    """How much each query position weighs in the pooled representation.

    Args:
        model: the explained model.
        mask: ``[B, T]`` bool, ``True`` on real tokens.

    Returns:
        ``[B, T]`` float rows summing to 1: one-hot on position 0 for first-token
        pooling, uniform over real tokens for mean pooling, one-hot on the last real
        token for a causal decoder.
    """
    if mask.dim() != 2:
        raise ValueError(f"mask must be a [B, T] padding mask, got shape {tuple(mask.shape)}")
    pooling = pooling_of(model)
    if pooling == "mean":
        real = mask.float()
        return real / real.sum(-1, keepdim=True).clamp_min(1.0)  # [B, T]
    weights = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if pooling == "last":
        B, T = mask.shape
        positions = torch.arange(T, device=mask.device).expand(B, T)
        last = torch.where(mask.bool(), positions, -1).amax(-1).clamp_min(0)  # [B]: last real token
        weights[torch.arange(B, device=mask.device), last] = 1.0
        return weights
    weights[:, 0] = 1.0
    return weights


def logits_of(output: Any) -> Tensor:
    """The ``[B, C]`` logits of a model's output (``.logits`` or a 2-D ``output[0]``)."""
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, (tuple, list)) and isinstance(output[0], Tensor):
        logits = output[0]
    if not isinstance(logits, Tensor) or logits.dim() != 2:
        raise TypeError(
            "this method traces a class logit, so the model must return [B, C] logits "
            "(a classifier such as EncoderClassifier); a bare encoder supports raw, rollout and flow only"
        )
    return logits


def _per_example_targets(target, B: int, C: int, device) -> Tensor:
    """A class per example, as captum takes it: a ``[B]`` tensor or list (a 0-d tensor: one class)."""
    if isinstance(target, Tensor):
        if target.dim() == 0 and not target.is_floating_point() and target.dtype != torch.bool:
            target = target.reshape(1).expand(B)
        elif target.dim() != 1 or target.is_floating_point() or target.dtype == torch.bool:
            raise ValueError(f"a target tensor must hold one class index per example, [B] = [{B}] integers; "
                             f"got {target.dtype} of shape {tuple(target.shape)}")
        values = target.to(device=device, dtype=torch.long)
    else:
        if not all(isinstance(value, int) and not isinstance(value, bool) for value in target):
            raise TypeError(f"a target list must hold one class index (int) per example, got {list(target)!r}")
        values = torch.tensor(list(target), dtype=torch.long, device=device)
    if values.shape != (B,):
        raise ValueError(f"target must give one class per example: {B} values, got {values.numel()}")
    if bool(((values < 0) | (values >= C)).any()):
        raise ValueError(f"targets must lie in 0..{C - 1} (the model has {C} classes), got {values.tolist()}")
    return values


def resolve_target(
    logits: Tensor, target: Optional[Union[int, str, Tensor, list[int]]], label_names: Optional[list[str]] = None
) -> Tensor:
    """The explained class per example: ``target`` (an index or a label name) or the prediction.

    Args:
        logits: ``[B, C]``.
        target: a 0-based class index, a label name, one index per example (a ``[B]``
            tensor or list, as captum takes), or ``None`` for the predicted class.
        label_names: the model's class names, to read a name.

    Returns:
        ``[B]`` long.
    """
    B, C = logits.shape
    if target is None:
        return logits.argmax(-1)
    if isinstance(target, (Tensor, list, tuple)):
        return _per_example_targets(target, B, C, logits.device)
    if isinstance(target, str):
        names = list(label_names or [])
        if target in names:
            target = names.index(target)
        elif target.lstrip("-").isdigit():
            target = int(target)
        else:
            raise ValueError(
                f"target {target!r} is not a class of the model; its classes are {names or list(range(C))}"
            )
    if isinstance(target, bool) or not isinstance(target, int):
        raise TypeError(f"target must be a class index or a label name, got {type(target).__name__}")
    if not 0 <= target < C:
        raise ValueError(f"target must lie in 0..{C - 1} (the model has {C} classes), got {target}")
    return torch.full((B,), target, dtype=torch.long, device=logits.device)
