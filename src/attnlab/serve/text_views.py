"""What the explorer shows of a text model: every view computed by attnlab's own functions.

Dimension letters: ``L`` layers, ``H`` heads, ``T`` query rows, ``S`` keys, ``V`` vocabulary.

A view is one forward of the text with the chosen heads switched off
(:func:`~attnlab.inspect.compute.heads.mask_heads`, the library's head mask) and every map
captured (:func:`~attnlab.inspect.compute.capture.capture_attention`): the tokens, a
layers x heads grid of statistics (:class:`~attnlab.inspect.compute.statistics.HeadStatistics`;
for decoders :func:`~attnlab.inspect.compute.causal_statistics.causal_statistics` and
:func:`~attnlab.inspect.compute.head_roles.head_role_scores`), and the prediction. The last
view's maps are kept (one entry, float16) so that a click on a head costs no forward. Nothing
here is thread-safe: :class:`~attnlab.serve.session.ModelSession` runs one call at a time.
"""

from __future__ import annotations

import base64
import contextlib
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ..inspect.compute.attn_lrp_rules import refusal as attn_lrp_refusal
from ..inspect.compute.attribution_target import is_causal_model
from ..inspect.compute.capture import attention_heads, capture_attention, find_attention_modules
from ..inspect.compute.causal_statistics import causal_statistics
from ..inspect.compute.generation_attribution import GENERATION_METHODS
from ..inspect.compute.head_roles import head_role_scores
from ..inspect.compute.heads import forward_batch, mask_heads
from ..inspect.compute.inspectable import NotOffered
from ..inspect.compute.statistics import HeadStatistics
from ..inspect.compute.token_attribution import METHODS
from ..inspect.compute.token_groups import special_token_groups
from ..inspect.faithfulness import model_family
from ..workflows.explain_generation import context_limit, explain_generation
from ..workflows.explain_text import explain
from ..workflows.inspect_text import encode_text
from .faithfulness import faithfulness_of
from .limits import RequestError, ServeLimits

__all__ = ["TextExplorer", "pack_weights"]

_TOP = 10  # next tokens (or labels) listed
_ATTENTION_METHODS = ("raw", "rollout", "flow")  # what a bare encoder can be explained by
_PER_TOKEN_METHODS = ("occlusion", "integrated-gradients")  # one forward per token or per point


def pack_weights(values: Tensor) -> str:
    """Weights in ``[0, 1]`` as base64 little-endian uint16 (``w * 65535``), the report pages' packing."""
    scaled = np.rint(values.detach().float().clamp(0, 1).cpu().numpy() * 65535).astype("<u2")
    return base64.b64encode(scaled.tobytes()).decode("ascii")


def _kind_of(model: nn.Module, logits: Optional[Tensor]) -> str:
    if logits is not None and logits.dim() == 3 and is_causal_model(model):
        return "decoder"
    if logits is not None and logits.dim() == 2:
        return "classifier"
    return "encoder"


def _logits(output: Any) -> Optional[Tensor]:
    logits = getattr(output, "logits", None)
    return logits if isinstance(logits, Tensor) else None


@dataclass
class _Captured:
    """The last view's forward: its key, maps ``{layer: [H, T, S]}`` (float16) and logits."""

    key: tuple
    maps: dict[str, Tensor]
    logits: Optional[Tensor]


class TextExplorer:
    """The views of one text model (encoder, classifier or decoder).

    Args:
        model: what :func:`~attnlab.workflows.resolve.resolve_model` opened (attnlab's
            models or a :class:`~attnlab.hf.opening.TransformersModel`).
        tokenizer: its tokenizer.
        name: shown on the page.
        limits: the request bounds.
    """

    def __init__(self, model: nn.Module, tokenizer: Any, name: str, limits: ServeLimits) -> None:
        self.model, self.tokenizer, self.name, self.limits = model.eval(), tokenizer, name, limits
        modules = find_attention_modules(model)
        if not modules:
            raise ValueError(f"{name}: no attention module found; the explorer shows attention maps")
        self.layers = list(modules)
        self.heads = [attention_heads(module) or 1 for module in modules.values()]
        self._groups = special_token_groups(tokenizer)
        probe, _ = encode_text(tokenizer, "Hello world", 8)
        with torch.no_grad():
            logits = _logits(forward_batch(model, {"input_ids": probe, "mask": torch.ones_like(probe, dtype=torch.bool)}))
        self.kind = _kind_of(model, logits)
        self.vocabulary = int(logits.shape[-1]) if self.kind == "decoder" else 0  # ids a step may feed back
        self.label_names = getattr(model, "label_names", None)
        self._attn_lrp_refusal = attn_lrp_refusal(model)  # why attn-lrp cannot explain it, or None
        context = context_limit(model) if self.kind == "decoder" else getattr(tokenizer, "model_max_length", None)
        self.context = context if isinstance(context, int) and context > 0 else None
        self.max_tokens = min(limits.max_tokens, self.context or limits.max_tokens)
        self._last: Optional[_Captured] = None

    # -- what the page is told at start ---------------------------------------------------
    def methods(self) -> list[str]:
        if self.kind == "decoder":
            return [method for method in GENERATION_METHODS if method != "attn-lrp" or self._attn_lrp()]
        if self.kind == "classifier":
            return [method for method in METHODS if (method != "relevance" or self._dense())
                    and (method != "attn-lrp" or self._attn_lrp())]
        return list(_ATTENTION_METHODS)

    def _attn_lrp(self) -> bool:
        """AttnLRP serves models whose every module its rules know (attnlab's, known transformers families)."""
        return self._attn_lrp_refusal is None

    def _dense(self) -> bool:
        """LRP relevance serves encoder classifiers with plain dense attention (not transformers models)."""
        return hasattr(self.model, "encoder") and not getattr(getattr(self.model, "encoder", None), "rotary", None)

    def info(self) -> dict[str, Any]:
        return {"model": self.name, "kind": self.kind, "layers": len(self.layers), "heads": self.heads,
                "layer_names": self.layers, "methods": self.methods(), "labels": self.label_names,
                "max_tokens": self.max_tokens, "max_new_tokens": self.limits.max_new_tokens,
                "map_cells": self.limits.map_cells, "explain_tokens": self.limits.explain_tokens,
                "can_patch": self.kind in ("decoder", "classifier"),
                "faithfulness": faithfulness_of(self.kind, model_family(self.model))}

    # -- one forward ---------------------------------------------------------------------
    def encode(self, text: str, field: str = "text") -> tuple[Tensor, list[str]]:
        """``(input_ids [1, T], tokens)``; a text past the token budget is refused, not cut."""
        try:
            input_ids, tokens = encode_text(self.tokenizer, text, self.limits.max_chars * 4)
        except ValueError as error:
            raise RequestError(422, f"{field}: {error}") from None
        if len(tokens) > self.max_tokens:
            raise RequestError(413, f"{field} has {len(tokens)} tokens; the explorer takes at most {self.max_tokens} "
                                    f"here (shorten it, or start the server with a larger --max-tokens)")
        return input_ids, tokens

    def _switched_off(self, off: Sequence[tuple[int, int]]) -> dict[str, list[int]]:
        """``[(layer, head)]`` counted from 1 -> the head mask's ``{layer name: [0-based heads]}``."""
        chosen: dict[str, list[int]] = {}
        for layer, head in off:
            chosen.setdefault(self.layers[layer - 1], []).append(head - 1)
        return chosen

    def _forward(self, input_ids: Tensor, off: Sequence[tuple[int, int]]) -> _Captured:
        key = (tuple(input_ids[0].tolist()), tuple(off))
        if self._last is not None and self._last.key == key:
            return self._last
        self._last = None  # the old maps go before the new ones are made
        masked = mask_heads(self.model, self._switched_off(off)) if off else contextlib.nullcontext()
        mask = torch.ones_like(input_ids, dtype=torch.bool)  # [1, T]: every token real
        with torch.no_grad(), masked, capture_attention(self.model) as captured:
            output = forward_batch(self.model, {"input_ids": input_ids, "mask": mask})
        maps = {name: weights[0].to(torch.float16) for name, weights in captured.attentions.items()}  # [H, T, S]
        logits = _logits(output)
        self._last = _Captured(key, maps, None if logits is None else logits[0].float())
        return self._last

    # -- the views -------------------------------------------------------------------------
    def view(self, text: str, off: Sequence[tuple[int, int]], track: Sequence[int] = ()) -> dict[str, Any]:
        """Tokens, the statistics grid and the prediction of ``text`` with heads ``off``."""
        input_ids, tokens = self.encode(text)
        captured = self._forward(input_ids, off)
        return {"tokens": tokens, "ids": input_ids[0].tolist(), "off": [f"{l}:{h}" for l, h in off],
                "statistics": self._statistics(captured, input_ids),
                "prediction": self._prediction(captured.logits, track)}

    def _statistics(self, captured: _Captured, input_ids: Tensor) -> dict[str, list[list[Optional[float]]]]:
        """``{statistic: [L][H]}`` (``None`` where a head has no counted row)."""
        maps = {name: weights.float()[None] for name, weights in captured.maps.items()}  # [1, H, T, S]
        if self.kind == "decoder":  # the statistics that fit causal maps (each row's allowed prefix), and roles
            causal = causal_statistics(maps)
            tables = {stat: [causal[stat][name] for name in self.layers] for stat in causal}
            roles = head_role_scores(maps, input_ids)
            for role in ("previous-token", "induction", "duplicate-token", "first-token"):
                tables[role] = [[None if value != value else value for value in row] for row in roles[role].tolist()]
        else:
            mask = torch.ones_like(input_ids, dtype=torch.bool)
            statistics = HeadStatistics(token_groups=self._groups)
            for name, weights in maps.items():
                statistics.update(name, weights, mask, mask, input_ids=input_ids)
            means = statistics.means()
            tables = {stat: [means[name][stat] for name in self.layers] for stat in next(iter(means.values()))}
        return {stat: [[None if value is None else round(float(value), 5) for value in row] for row in rows]
                for stat, rows in tables.items()}

    def _prediction(self, logits: Optional[Tensor], track: Sequence[int] = ()) -> Optional[dict[str, Any]]:
        if logits is None or self.kind == "encoder":
            return None
        if self.kind == "decoder":
            probabilities = torch.softmax(logits[-1], -1)  # [V]: the next token after the text
            values, ids = torch.topk(probabilities, min(_TOP, probabilities.shape[-1]))
            return {"kind": "next token", "top": [
                {"id": int(i), "token": self.tokenizer.decode([int(i)], skip_special_tokens=False),
                 "probability": float(p)} for p, i in zip(values, ids)],
                "tracked": {str(int(i)): float(probabilities[int(i)]) for i in track}}
        probabilities = torch.softmax(logits, -1)  # [C]
        names = self.label_names or [str(index) for index in range(probabilities.shape[-1])]
        return {"kind": "label", "top": [{"id": index, "token": names[index], "probability": float(p)}
                                         for index, p in enumerate(probabilities.tolist())],
                "tracked": {str(int(i)): float(probabilities[int(i)]) for i in track if int(i) < len(names)}}

    def head_map(self, text: str, off: Sequence[tuple[int, int]], layer: int, head: Optional[int],
                 rows: Optional[tuple[int, int]]) -> dict[str, Any]:
        """One head's map (``head=None``: the layer's mean over heads): whole, a row range, or pooled."""
        input_ids, tokens = self.encode(text)
        weights = self._forward(input_ids, off).maps[self.layers[layer - 1]]  # [H, T, S]
        matrix = weights.float().mean(0) if head is None else weights[head - 1].float()  # [T, S]
        T, S = matrix.shape
        cells = self.limits.map_cells
        if rows is not None:
            start, stop = rows
            shown, kind, row_edges = matrix[start:stop], "rows", list(range(start, stop + 1))
            col_edges = list(range(S + 1))
        elif max(T, S) <= cells:
            shown, kind, row_edges, col_edges = matrix, "full", list(range(T + 1)), list(range(S + 1))
        else:
            row_edges, col_edges = _edges(T, cells), _edges(S, cells)
            shown, kind = _pooled(matrix, row_edges, col_edges), "pooled"
        return {"layer": layer, "head": head, "kind": kind, "length": [T, S], "shape": list(shown.shape),
                "row_edges": row_edges, "col_edges": col_edges, "weights": pack_weights(shown),
                "max": float(shown.max()) if shown.numel() else 0.0, "tokens": tokens}

    def step(self, text: str, generated: list[int], off: Sequence[tuple[int, int]]) -> dict[str, Any]:
        """The greedy next token after ``text`` + ``generated``, and what the last position attended to."""
        if self.kind != "decoder":
            raise RequestError(422, f"{self.name} is not a decoder; step-by-step generation needs one (a GPT-2 or "
                                    f"Llama-family model, smollm2)")
        input_ids, _ = self.encode(text)
        if generated:
            input_ids = torch.cat([input_ids, torch.tensor([generated])], dim=1)
        if self.context is not None and input_ids.shape[1] >= self.context:
            raise RequestError(413, f"the prompt and {len(generated)} generated tokens fill the model's "
                                    f"{self.context} positions; start again from a shorter prompt")
        captured = self._forward(input_ids, off)
        probabilities = torch.softmax(captured.logits[-1], -1)  # [V]
        chosen = int(probabilities.argmax())
        rows = torch.stack([captured.maps[name][:, -1].float() for name in self.layers])  # [L, H, S]
        ids = input_ids[0].tolist()
        return {"token": self.tokenizer.decode([chosen], skip_special_tokens=False), "id": chosen,
                "probability": float(probabilities[chosen]),
                "tokens": [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids],
                "position": len(ids) - 1, "attended": pack_weights(rows), "shape": list(rows.shape)}

    def explain(self, text: str, method: str, off: Sequence[tuple[int, int]] = ()) -> dict[str, Any]:
        """Per-token scores of ``text`` by ``method``: for the predicted class, or the greedy next
        token, of the model with heads ``off`` switched off (the library's head mask)."""
        masked = mask_heads(self.model, self._switched_off(off)) if off else contextlib.nullcontext()
        try:
            with masked:
                found = self._explain(text, method)
        except ValueError as error:
            if not off:
                raise
            raise RequestError(422, f"{method} does not explain the model with heads off ({error}); switch the "
                                    f"heads on, or choose another method") from None
        if off:
            found["explained"] += f", with {len(off)} head(s) off"
        found["off"] = [f"{layer}:{head}" for layer, head in off]
        return found

    def _explain(self, text: str, method: str) -> dict[str, Any]:
        if method not in self.methods():
            raise RequestError(422, f"method {method!r} does not serve {self.name} ({self.kind}); choose one of "
                                    f"{', '.join(self.methods())}")
        input_ids, tokens = self.encode(text)
        if method in _PER_TOKEN_METHODS + ("integrated-gradients",) and len(tokens) > self.limits.explain_tokens:
            raise RequestError(413, f"{method} runs the model once per token or per point: the explorer runs it on "
                                    f"texts of at most {self.limits.explain_tokens} tokens (this one has {len(tokens)}); "
                                    f"choose raw, rollout or grad-attention, or shorten the text")
        if self.kind == "decoder":
            (found,) = explain_generation(self.model, self.tokenizer, text, [method], max_new_tokens=1, lens=False)
            P = found.prompt_length
            # AttnLRP explains the logit
            quantity = "its logit" if method == "attn-lrp" else found.objective_name
            return {"method": method, "tokens": found.tokens[:P], "scores": found.scores[method][0][:P],
                    "explained": f"the next token {found.generated[0]!r} ({quantity})"}
        found = explain(self.model, self.tokenizer, text, [method], max_length=self.max_tokens)
        return {"method": method, "tokens": found.tokens, "scores": found.scores[method],
                "explained": found.describe_target()}

    def patch(self, text: str, source: str, heads: Sequence[tuple[int, int]]) -> dict[str, Any]:
        """Patch ``heads`` from the run of ``source`` into the run of ``text``: the predicted logit
        before, in the source run, and patched (the library's activation patching)."""
        if self.kind not in ("decoder", "classifier"):
            raise RequestError(422, f"{self.name} has no prediction to patch (a bare encoder); patching reads a class "
                                    f"or next-token logit")
        if not heads:
            raise RequestError(422, "heads is empty: choose the heads to patch (click them in the grid)")
        target_ids, _ = self.encode(text)
        source_ids, _ = self.encode(source, "source")
        if source_ids.shape != target_ids.shape:
            raise RequestError(422, f"source has {source_ids.shape[1]} tokens and text {target_ids.shape[1]}: "
                                    f"patching replaces position by position, so give texts of one length")
        result = _patch_heads(self.model, source_ids, target_ids, self._switched_off(heads))
        names = self.label_names
        label = (self.tokenizer.decode([result.label], skip_special_tokens=False) if self.kind == "decoder"
                 else (names[result.label] if names else str(result.label)))
        recovered = float(result.recovered[0])
        return {"label": label, "id": result.label, "clean": float(result.clean[0]),
                "source": float(result.source[0]), "patched": float(result.patched[0]),
                "recovered": None if recovered != recovered else recovered,
                "heads": [f"{l}:{h}" for l, h in heads]}


def _patch_heads(model: nn.Module, source_ids: Tensor, target_ids: Tensor, heads: dict[str, list[int]]) -> Any:
    from ..inspect.compute.patching import patch_heads

    try:
        return patch_heads(model, source_ids, target_ids, heads)
    except (TypeError, NotOffered) as error:  # a model whose heads the library cannot patch
        raise RequestError(422, str(error)) from None


def _edges(length: int, buckets: int) -> list[int]:
    """``buckets + 1`` increasing cut points over ``0..length`` (neighbouring positions pooled)."""
    return np.unique(np.linspace(0, length, min(buckets, length) + 1).round().astype(int)).tolist()


def _pooled(matrix: Tensor, row_edges: list[int], col_edges: list[int]) -> Tensor:
    """The mean of ``matrix`` over each block of rows and columns between the edges."""
    values = matrix.numpy()
    summed = np.add.reduceat(np.add.reduceat(values, row_edges[:-1], axis=0), col_edges[:-1], axis=1)
    counts = np.outer(np.diff(row_edges), np.diff(col_edges))
    return torch.from_numpy(summed / counts)
