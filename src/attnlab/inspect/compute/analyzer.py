"""``AttentionAnalyzer``: attention statistics over a whole data set, head importance, ablation.

Dimension letters: ``L`` layers, ``H`` heads, ``B`` batch, ``T`` length.

The article's call works as written::

    analyzer = AttentionAnalyzer(model)
    stats = analyzer.analyze_attention_distribution(dataloader)
    stats["entropy"]          # [L][H] mean entropy per layer and head

Unlike the article's version it excludes padding, takes the sparsity threshold as a
parameter, computes the ``alignment_score`` it promises, streams (memory does not grow
with the data) and reads the weights through :func:`capture_attention`, so it works on
any model built from attnlab attention modules. Statistics are defined in
:mod:`attnlab.inspect.compute.statistics`; batches may take the forms in
:mod:`attnlab.inspect.compute.batches`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Optional, Union

import numpy as np
import torch
from torch import Tensor, nn

from ..._files import write_json
from ...data.padding import model_pad_id
from .modes import eval_mode
from .batches import as_analysis_batch
from .heads import LossFn, default_loss, forward_batch, head_gradients, head_importance
from .inspectable import inspectable, sliding_window
from .site_statistics import SiteStatistics
from .statistics import HeadStatistics

__all__ = ["AttentionAnalyzer", "AttentionStatistics", "EvaluationResult"]


@dataclass
class AttentionStatistics:
    """What :meth:`AttentionAnalyzer.analyze_attention_distribution` returns.

    Attributes:
        layers: layer names, ``["layer_1", ...]``.
        num_heads: heads per layer.
        statistics: ``{statistic: {layer: [value per head]}}`` (``None`` where no row
            counted, e.g. ``alignment_score`` with no reference key).
        rows: ``{layer: [query rows counted per head]}``.
        rollout: ``{layer: {"entropy": ..., "self": ...}}``: mean entropy of the rollout
            rows after that layer and mean share a token keeps of itself, or ``None``.
        examples: number of examples seen; tokens: number of real tokens seen.
        settings: the parameters the statistics were computed with.
        head_importance: ``[L][H]`` when computed, else ``None``.
    """

    layers: list[str]
    num_heads: list[int]
    statistics: dict[str, dict[str, list[Optional[float]]]]
    rows: dict[str, list[int]]
    rollout: Optional[dict[str, dict[str, float]]]
    examples: int
    tokens: int
    settings: dict[str, Any] = field(default_factory=dict)
    head_importance: Optional[list[list[float]]] = None

    def __getitem__(self, name: str) -> list[list[Optional[float]]]:
        """``stats["entropy"]`` -> ``[L][H]`` nested list (the article's dict access)."""
        if name not in self.statistics:
            raise KeyError(f"unknown statistic {name!r}; available: {sorted(self.statistics)}")
        return [self.statistics[name][layer] for layer in self.layers]

    def __contains__(self, name: object) -> bool:
        return name in self.statistics

    def __iter__(self) -> Iterator[str]:
        """The statistic names, as a dict's keys (``for name in stats``)."""
        return iter(self.statistics)

    def __len__(self) -> int:
        return len(self.statistics)

    def keys(self) -> list[str]:
        return list(self.statistics)

    def values(self) -> list[list[list[Optional[float]]]]:
        return [self[name] for name in self.statistics]

    def items(self) -> list[tuple[str, list[list[Optional[float]]]]]:
        """``(name, [L][H] values)`` pairs, as ``stats[name]`` gives them."""
        return [(name, self[name]) for name in self.statistics]

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self.statistics else default

    def matrix(self, name: str) -> np.ndarray:
        """``[L, H]`` float array of one statistic (NaN where missing or a layer has fewer heads)."""
        values = self[name]
        out = np.full((len(self.layers), max(self.num_heads)), np.nan)
        for row, per_head in enumerate(values):
            for column, value in enumerate(per_head):
                out[row, column] = np.nan if value is None else value
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save_json(self, path: Union[str, Path]) -> Path:
        """Write :meth:`to_dict` as JSON (NaN-free: missing values are ``null``)."""
        path = Path(path)
        write_json(path, self.to_dict())
        return path


@dataclass
class EvaluationResult:
    """Mean loss (and accuracy when the model gives logits and the batches labels)."""

    loss: float
    accuracy: Optional[float]
    examples: int


class AttentionAnalyzer:
    """Attention statistics, rollout, head importance and head ablation for one model.

    Args:
        model: any model built from attnlab attention modules; called as
            ``model(input_ids)`` or ``model(input_ids, mask=mask)`` when the batch has a mask.
        pad_id: padding id for batches without a mask; default the model's ``config.pad_id``.
        sparsity_threshold: weight below which a key counts as unattended (the article
            fixed 0.1; pick e.g. ``1 / typical length`` for long inputs).
        top_k: number of largest weights added up in ``top_k_mass``.
        token_groups: ``{name: token ids}`` whose attention mass is reported as
            ``mass_<name>``, e.g. ``{"cls": [101], "sep": [102], "punct": [...]}``.
        rollout: also compute attention-rollout summaries per layer.
        residual_weight: share of attention against the residual in the rollout.

    Example:
        >>> analyzer = AttentionAnalyzer(model)
        >>> stats = analyzer.analyze_attention_distribution([(ids, labels)])
        >>> stats["normalized_entropy"][0]     # layer 1, one value per head
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        pad_id: Optional[int] = None,
        sparsity_threshold: float = 0.1,
        top_k: int = 3,
        token_groups: Optional[Mapping[str, Collection[int]]] = None,
        rollout: bool = True,
        residual_weight: float = 0.5,
    ) -> None:
        self.view = inspectable(model)
        self.model = model
        self.pad_id = model_pad_id(model) if pad_id is None else pad_id
        self.sparsity_threshold = sparsity_threshold
        self.top_k = top_k
        self.token_groups = dict(token_groups or {})
        self.rollout = rollout
        self.residual_weight = residual_weight
        HeadStatistics(sparsity_threshold=sparsity_threshold, top_k=top_k)  # validates early

    def _settings(self) -> dict[str, Any]:
        return {
            "sparsity_threshold": self.sparsity_threshold,
            "top_k": self.top_k,
            "token_groups": {name: sorted(map(int, ids)) for name, ids in self.token_groups.items()},
            "residual_weight": self.residual_weight,
            "pad_id": self.pad_id,
            "alignment_reference": "batch alignment, else |s - t| == 1",
            **({"decoder_input": self.view.decoder_input} if getattr(self.view, "decoder_input", None) else {}),
        }

    def _rollout_layers(self) -> Optional[list[str]]:
        """The layers rollout runs through: the self-attention layers of the first stack
        (the model's only one, an encoder-decoder's encoder), when no cross-attention
        feeds that stack; else ``None``."""
        sites = self.view.attention_sites()
        stack = sites[0].name.rpartition(".")[0]
        chosen = [site for site in sites if site.name.rpartition(".")[0] == stack]
        if any(site.cross for site in chosen):
            return None
        return [site.name for site in chosen]

    def analyze_attention_distribution(
        self,
        dataloader: Iterable[Any],
        *,
        head_mask: Optional[Union[Tensor, Mapping[str, Iterable[int]]]] = None,
        progress: bool = False,
        total: Optional[int] = None,
    ) -> AttentionStatistics:
        """Per-layer, per-head statistics over every batch of ``dataloader``.

        The weights are reduced as the model makes them
        (:meth:`~attnlab.inspect.compute.inspectable.Inspectable.statistics`): a
        transformers model's block by block of query rows, attnlab's own layer by layer;
        the rollout summaries follow the layers the same way.

        Args:
            dataloader: an iterable of batches (a tensor of ids, ``(ids, labels)`` as in
                the article, or a dict with ``input_ids`` and optionally ``mask``,
                ``labels``, ``alignment``).
            head_mask: analyse with these heads switched off (see :func:`mask_heads`); a
                switched-off head's weights are zero, so its statistics are ``None``.
            progress: show a progress bar (tqdm, on stderr).
            total: number of examples, for the progress bar.

        Returns:
            :class:`AttentionStatistics`.
        """
        with _progress(progress, total) as bar:
            state = self.statistics_pass(
                dataloader, head_mask=head_mask,
                after_batch=None if bar is None else (lambda state, size: bar.update(size)))
        return self.statistics_from(state, head_mask=head_mask)

    def statistics_pass(
        self,
        dataloader: Iterable[Any],
        *,
        head_mask: Optional[Union[Tensor, Mapping[str, Iterable[int]]]] = None,
        state: Optional[Mapping[str, Any]] = None,
        after_batch: Optional[Callable[[dict[str, Any], int], None]] = None,
    ) -> dict[str, Any]:
        """The sums behind :meth:`analyze_attention_distribution` over ``dataloader``.

        Args:
            state: a pass to continue (what this method returned, or the ``state`` handed
                to ``after_batch``); its sums are added to.
            after_batch: called after each batch with a callable giving the state so far
                and the batch's number of examples (a checkpoint, a progress bar).

        Returns:
            ``{"statistics": SiteStatistics.state(), "examples": n, "tokens": n}``: float64
            sums and counts, which add exactly across processes
            (:func:`~attnlab.inspect.compute.site_statistics.add_states`) and give the
            result through :meth:`statistics_from`.
        """
        view = self.view
        rollout_layers = self._rollout_layers() if self.rollout else None
        examples = 0 if state is None else int(state["examples"])
        tokens = 0 if state is None else int(state["tokens"])
        ablation = view.intervene(head_mask=head_mask) if head_mask is not None else contextlib.nullcontext()
        with (
            torch.no_grad(),
            view.statistics(sparsity_threshold=self.sparsity_threshold, top_k=self.top_k,
                            token_groups=self.token_groups) as recorder,
            ablation,
        ):
            if rollout_layers:
                recorder.follow_rollout(rollout_layers, self.residual_weight)
            if state is not None:
                recorder.load_state(state["statistics"])

            def so_far() -> dict[str, Any]:
                return {"statistics": recorder.state(), "examples": examples, "tokens": tokens}

            for batch in dataloader:
                normalised = as_analysis_batch(batch, self.pad_id)
                recorder.alignment = normalised.alignment
                forward_batch(self.view, batch, self.pad_id)
                examples += normalised.input_ids.shape[0]
                tokens += int(normalised.mask.sum())
                if after_batch is not None:
                    after_batch(so_far, normalised.input_ids.shape[0])
            return so_far()

    def statistics_from(self, state: Mapping[str, Any], *,
                        head_mask: Optional[Union[Tensor, Mapping[str, Iterable[int]]]] = None) -> AttentionStatistics:
        """:class:`AttentionStatistics` of the sums of :meth:`statistics_pass` (of one process,
        or several added)."""
        if int(state["examples"]) == 0:
            raise ValueError("dataloader yielded no batch")
        recorder = SiteStatistics(sparsity_threshold=self.sparsity_threshold, top_k=self.top_k,
                                  token_groups=self.token_groups)
        window = sliding_window(self.view.attention_sites())
        recorder.window = window
        rollout_layers = self._rollout_layers() if self.rollout else None
        if rollout_layers:
            recorder.follow_rollout(rollout_layers, self.residual_weight)
        recorder.load_state(state["statistics"])
        means = recorder.means()
        layers = list(means)
        names = list(dict.fromkeys(name for layer in layers for name in means[layer]))
        table = {name: {layer: means[layer].get(name, [None] * len(means[layer]["entropy"])) for layer in layers}
                 for name in names}
        # A causal layer's query sees only its prefix: its entropy is normalised by that, not the sequence.
        for name, values in recorder.causal_means().items():
            for layer, per_head in values.items():
                row = table.setdefault(name, {other: [None] * len(means[other]["entropy"]) for other in layers})
                row[layer] = per_head
        table.pop("causal_normalized_entropy", None)  # it is the normalized_entropy of a causal layer now
        rollout = None
        if self.rollout:
            rollout = (recorder.rollout_means() or {}) if rollout_layers else {}
        return AttentionStatistics(
            layers=layers,
            num_heads=[len(means[layer]["entropy"]) for layer in layers],
            statistics=table,
            rows=recorder.row_counts(),
            rollout=rollout,
            examples=int(state["examples"]),
            tokens=int(state["tokens"]),
            settings={**self._settings(), "head_mask": _describe(head_mask), "sliding_window": window},
        )

    def importance_pass(self, dataloader: Iterable[Any], state: Optional[Mapping[str, Any]] = None,
                        after_batch: Optional[Callable[[Callable[[], dict[str, Any]], int], None]] = None,
                        *, loss_fn: Optional[LossFn] = None) -> dict[str, Any]:
        """The sums behind :meth:`head_importance`: ``{"total": [L, H] float64 |dLoss/d xi|
        summed over batches, "batches": n}`` (continuing ``state``; ``after_batch`` as in
        :meth:`statistics_pass`). :func:`~attnlab.inspect.compute.heads.importance_from`
        gives the importance."""
        total = None if state is None else state["total"]
        batches = 0 if state is None else int(state["batches"])

        def so_far() -> dict[str, Any]:
            return {"total": total, "batches": batches}

        with eval_mode(self.model):
            for batch in dataloader:
                gradient = head_gradients(self.view, batch, loss_fn=loss_fn, pad_id=self.pad_id)
                total = gradient if total is None else total + gradient
                batches += 1
                if after_batch is not None:
                    after_batch(so_far, as_analysis_batch(batch, self.pad_id).input_ids.shape[0])
        return so_far()

    def head_importance(
        self, dataloader: Iterable[Any], *, loss_fn: Optional[LossFn] = None, normalize: bool = False
    ) -> Tensor:
        """``[L, H]`` head importance (Michel et al., 2019); see :func:`head_importance`."""
        return head_importance(
            self.model, dataloader, loss_fn=loss_fn, pad_id=self.pad_id, normalize=normalize
        )

    def evaluate(
        self,
        dataloader: Iterable[Any],
        *,
        loss_fn: Optional[LossFn] = None,
        head_mask: Optional[Union[Tensor, Mapping[str, Iterable[int]]]] = None,
    ) -> EvaluationResult:
        """Mean loss (and accuracy) in eval mode, optionally with heads switched off.

        Args:
            dataloader: batches with labels (or whatever ``loss_fn`` needs).
            loss_fn: ``loss_fn(output, batch) -> scalar``; default cross-entropy on logits.
            head_mask: ``[L, H]`` multipliers or ``{"layer_k": [heads to remove]}``.
        """
        loss_fn = loss_fn or default_loss
        total_loss = correct = examples = 0.0
        has_accuracy = True
        with eval_mode(self.model):
            with (
                torch.no_grad(),
                self.view.intervene(head_mask=head_mask) if head_mask is not None else contextlib.nullcontext(),
            ):
                for batch in dataloader:
                    normalised = as_analysis_batch(batch, self.pad_id)
                    output = forward_batch(self.view, batch, self.pad_id)
                    size = normalised.input_ids.shape[0]
                    total_loss += float(loss_fn(output, batch)) * size
                    logits = getattr(output, "logits", None)
                    if logits is not None and normalised.labels is not None and logits.dim() == 2:
                        correct += float((logits.argmax(-1) == normalised.labels.to(logits.device)).sum())
                    else:
                        has_accuracy = False
                    examples += size
        if examples == 0:
            raise ValueError("dataloader yielded no batch")
        return EvaluationResult(
            total_loss / examples, correct / examples if has_accuracy else None, int(examples)
        )


def _progress(show: bool, total: Optional[int]):
    if not show:
        return contextlib.nullcontext()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="analyze", unit="example")


def _describe(head_mask: Any) -> Any:
    if head_mask is None:
        return None
    if isinstance(head_mask, Tensor):
        return head_mask.tolist()
    # Files are read by people: heads by name, numbered from 1 like the layers.
    return {
        layer: [f"head_{int(head) + 1}" for head in sorted(map(int, heads))] for layer, heads in head_mask.items()
    }
