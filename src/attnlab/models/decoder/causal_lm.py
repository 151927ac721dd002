"""A decoder-only language model: GPT-2 and the Llama family (Llama, Mistral, Qwen2, SmolLM).

Dimension letters: ``B`` batch, ``T`` new positions, ``S`` all positions (cached + new),
``E`` model dim, ``V`` vocabulary, ``H`` heads.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..._checks import check_inputs_match
from ..._precision import Linear
from ..._pretrained_io import PretrainedIO
from ...attention.masks import keep_mask
from ...layers.decoder_config import DecoderConfig
from ...layers.decoder_layer import build_decoder_layer, build_norm
from ...layers.decoder_mask import decoder_attention_mask
from ...layers.kv_cache import KVCache
from ...attention.rotary import ScaledRotary
from ...outputs import LayerAttentions
from ..encoder import model_config_part
from .outputs import CausalLMOutput

__all__ = ["DecoderForCausalLM", "positions_from_mask"]


def positions_from_mask(keep: Tensor) -> Tensor:
    """Each token's position counted over real tokens only: ``[B, S]`` keep -> ``[B, S]``.

    A left-padded row starts at 0 on its first real token, so it computes what the same
    text computes unpadded (HuggingFace's ``generate`` counts the same way). Padding gets 0.
    """
    return (keep.long().cumsum(-1) - 1).clamp(min=0)


class DecoderForCausalLM(nn.Module, PretrainedIO):
    """Token embedding, pre-norm decoder layers, a final norm and an LM head.

    ``from_pretrained(dir)`` / ``attnlab.load(dir)`` open HuggingFace GPT-2, Llama,
    Mistral and Qwen2 directories and the packaged ``"smollm2"``; ``save_pretrained(dir)``
    writes attnlab's layout, ``save_pretrained(dir, layout="huggingface")`` the family's.

    Args:
        config: a :class:`~attnlab.layers.decoder_config.DecoderConfig`.

    Shape:
        ``input_ids`` ``[B, T]``; ``attention_mask`` ``[B, S]`` keep mask over cached and
        new positions (``True`` / 1 on real tokens, any dtype; left padding) -> logits
        ``[B, T, V]``, attentions ``[B, H, T, S]`` per layer.

    Example:
        >>> model = DecoderForCausalLM(DecoderConfig(vocab_size=100, d_model=32, num_layers=2,
        ...                                          num_heads=4, d_ff=64, num_kv_heads=2))
        >>> out = model(torch.tensor([[1, 2, 3]]), output_attentions=True)
        >>> out.logits.shape, out.attentions[0].shape
        (torch.Size([1, 3, 100]), torch.Size([1, 4, 3, 3]))
    """

    model_type = "decoder"

    @classmethod
    def from_config(
        cls, config: Union[DecoderConfig, dict[str, Any]], *, device=None, dtype=None
    ) -> "DecoderForCausalLM":
        """A fresh model from a :class:`DecoderConfig`, its dict, or a ``config.json`` dict
        of attnlab's layout (its ``"decoder"`` entry): the constructor, under the name
        every model class builds itself by (a dict's ``"pretrained_config"``, the HuggingFace
        ``config.json`` it came from, is kept for ``save_pretrained(layout="huggingface")``)."""
        model = cls(model_config_part(config, DecoderConfig, "decoder", cls.__name__), device=device, dtype=dtype)
        if isinstance(config, dict):
            model.checkpoint_config = config.get("pretrained_config")
        return model

    def __init__(self, config: DecoderConfig, *, device=None, dtype=None) -> None:
        super().__init__()
        if not isinstance(config, DecoderConfig):
            raise TypeError(f"config must be a DecoderConfig, got {type(config).__name__}")
        self.config = config
        factory = {"device": device, "dtype": dtype}
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, **factory)
        self.embed_positions = (nn.Embedding(config.max_len, config.d_model, **factory)
                                if config.position == "learned" else None)
        self.rotary = (ScaledRotary(config.attention_head_dim, config.rope_theta, config.rope_scaling,
                                    max_len=config.max_len, device=device)
                       if config.position == "rotary" else None)
        self.layers = nn.ModuleList(build_decoder_layer(config, index, **factory)
                                    for index in range(config.num_layers))
        self.norm = build_norm(config, **factory)
        self.lm_head = Linear(config.d_model, config.vocab_size, bias=False, **factory)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # the HuggingFace config.json it was opened from, kept for save_pretrained(layout="huggingface")
        self.checkpoint_config: Optional[dict[str, Any]] = None

    def new_cache(self, capacity: Optional[int] = None) -> KVCache:
        """An empty :class:`KVCache` for this model (room for ``capacity`` positions)."""
        return KVCache(self.config.num_layers, capacity)

    def _check_inputs(self, input_ids: Any, attention_mask: Any, past: int) -> Optional[Tensor]:
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
            shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise TypeError(f"input_ids must be an integer tensor [B, T], got {shape}")
        B, T = input_ids.shape
        if attention_mask is None:
            return None
        if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != (B, past + T):
            got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise ValueError(
                f"attention_mask must be [B, S] = [{B}, {past + T}] (cached + new positions, 1 on real "
                f"tokens), got {got}"
            )
        keep = keep_mask(attention_mask, name="attention_mask")
        return None if bool(keep.all()) else keep

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Optional[Tensor] = None,
        *,
        position_ids: Optional[Tensor] = None,
        past_key_values: Optional[KVCache] = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        labels: Optional[Tensor] = None,
        return_dict: bool = True,
        mask: Optional[Tensor] = None,
        logits_to_keep: int = 0,
    ) -> Union[CausalLMOutput, tuple]:
        """Next-token logits for ``input_ids`` after what ``past_key_values`` holds.

        Args:
            input_ids: ``[B, T]`` token ids.
            attention_mask: ``[B, S]`` keep mask (1 on real tokens) over cached and new
                positions; ``None`` = no padding. Either side in a plain pass; on the left
                for generation, so that every row ends with a real token.
            position_ids: ``[B, T]``; default: counted over real tokens
                (:func:`positions_from_mask`), continuing after the cache.
            past_key_values: a :class:`KVCache` to extend (see :meth:`new_cache`).
            use_cache: return the cache with these positions added (a new one if none given).
            output_attentions: return every layer's per-head weights (the reference
                kernel runs); otherwise the fused kernel runs.
            output_hidden_states: return the embedding output and every layer's output.
            labels: ``[B, T]`` targets; the loss compares position ``t``'s logits with
                ``labels[:, t + 1]`` (``-100`` ignored), as HuggingFace does.
            return_dict: ``False`` returns the tuple.
            mask: the encoders' name for ``attention_mask`` (``[B, S]``, 1 on real
                tokens), so the inspection tools drive decoders as they drive encoders.
            logits_to_keep: compute logits for the last this many positions only (0: all);
                generation needs the last one, and the LM head is a large share of a prompt's cost.
        """
        if mask is not None:
            if attention_mask is not None:
                raise ValueError("pass the padding mask once: attention_mask= or mask=, not both")
            attention_mask = mask
        cache = past_key_values
        if cache is None and use_cache:
            cache = self.new_cache()
        past = 0 if cache is None else len(cache)
        check_inputs_match(self, "DecoderForCausalLM", {"input_ids": input_ids, "attention_mask": attention_mask},
                           dtype=False)
        keep = self._check_inputs(input_ids, attention_mask, past)
        B, T = input_ids.shape
        S = past + T
        if position_ids is None:
            if keep is not None:
                position_ids = positions_from_mask(keep)[:, past:]  # [B, T]
            else:
                position_ids = torch.arange(past, S, device=input_ids.device).expand(B, T)  # [B, T]
        if self.embed_positions is not None and int(position_ids.max()) >= self.config.max_len:
            raise ValueError(f"position {int(position_ids.max())} is past max_len={self.config.max_len} of this model")
        allowed, is_causal = decoder_attention_mask(keep, T, S, sliding_window=self.config.sliding_window,
                                                    device=input_ids.device)  # [B|1, 1, T, S] or None
        x = self.embed_tokens(input_ids)  # [B, T, E]
        if self.embed_positions is not None:
            x = x + self.embed_positions(position_ids)
        rotary = None if self.rotary is None else self.rotary(position_ids, x.dtype)  # ([B, T, D],) x 2
        hidden: list[Tensor] = [x]
        weights: list[Optional[Tensor]] = []
        for index, layer in enumerate(self.layers):
            x, layer_weights = layer(x, rotary=rotary, mask=allowed, is_causal=is_causal, cache=cache,
                                     layer_index=index, need_weights=output_attentions)
            weights.append(layer_weights)
            hidden.append(x)
        x = self.norm(x)
        hidden[-1] = x
        logits = self.lm_head(x[:, -logits_to_keep:] if logits_to_keep else x)  # [B, T | logits_to_keep, V]
        loss = None
        if labels is not None:
            if logits_to_keep:
                raise ValueError("labels need logits at every position: leave logits_to_keep at 0")
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                   labels[:, 1:].reshape(-1), ignore_index=-100)
        out = CausalLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=cache if use_cache or past_key_values is not None else None,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=LayerAttentions(weights) if output_attentions else None,
        )
        return out if return_dict else out.to_tuple()

    def generate(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, **options: Any):
        """Continue ``input_ids``; see :func:`attnlab.models.decoder.generation.generate`."""
        from .generation import generate

        return generate(self, input_ids, attention_mask, **options)
