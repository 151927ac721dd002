"""A source/target pair through an encoder-decoder model: the cross-attention as a target x
source map per layer and head, both self-attentions, statistics and an alignment (what
``attnlab inspect --source --target`` and ``attnlab generate`` on a seq2seq model write).

Dimension letters: ``L`` layers, ``H`` heads, ``S`` source tokens, ``T`` target (decoder
input) tokens, ``G`` generated tokens, ``N = S + G``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from ..inspect.compute.statistics import HeadStatistics
from ..inspect.compute.word_alignment import attention_alignment, format_pharaoh
from ..inspect.draw.generation_report import write_generation_report
from ..inspect.draw.plots import plot_layer, save_figure
from ..inspect.draw.report import inline_frame, write_report
from .._files import write_json
from ..hf.audio import AudioFeatures

__all__ = ["PairInspection", "encode_side", "write_pair_inspection"]

# statistics that compare a query's position with its keys': meaningless across two sequences
_POSITIONAL = ("alignment_score", "alignment_argmax", "mean_offset", "mean_distance")


@dataclass
class PairInspection:
    """What :func:`write_pair_inspection` wrote.

    Attributes:
        report: ``report.html``, the cross-attention (target rows, source columns).
        pages: every page written (the report, ``encoder.html``, ``decoder.html``,
            ``generation.html`` when generated).
        figures: the pictures.
        source_tokens, target_tokens: the two sides (the target as the decoder reads it,
            its start token first).
        cross: ``{"cross.layer_k": [H, T, S]}``.
        alignment: the Pharaoh links from the cross-attention averaged over layers and heads:
            source token ``i`` - target token ``j`` (counted from 0 after the start token), read
            at the decoder step that predicts target token ``j``.
    """

    report: Path
    pages: list[Path] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    source_tokens: list[str] = field(default_factory=list)
    target_tokens: list[str] = field(default_factory=list)
    cross: dict[str, torch.Tensor] = field(default_factory=dict)
    alignment: str = ""

    def _repr_html_(self) -> str:
        return inline_frame(self.report.read_text(encoding="utf-8"), height=900)


def encode_side(tokenizer: Any, text: str, max_length: int, argument: str) -> tuple[torch.Tensor, list[str]]:
    """``(ids [S], tokens)`` of one side, cut to ``max_length`` tokens."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{argument} must be a non-empty text, got {text!r}")
    encoding = tokenizer.encode(text)
    ids, tokens = list(encoding.ids)[:max_length], list(encoding.tokens)[:max_length]
    if not ids:
        raise ValueError(f"{argument}: the tokenizer produced no token for {text!r}")
    return torch.tensor(ids, dtype=torch.long), tokens


def _token_text(tokenizer: Any, index: int) -> str:
    text = tokenizer.id_to_token(int(index)) if tokenizer is not None else None
    return text if text is not None else f"<{int(index)}>"


def _words_line(words) -> str:
    return ", ".join(f"{word.word} {word.start:.2f}-{word.end:.2f}" for word in words)


def _statistics(maps: dict[str, torch.Tensor], cross: bool) -> dict[str, dict[str, list]]:
    statistics = HeadStatistics()
    for name, weights in maps.items():
        H, T, S = weights.shape
        statistics.update(name, weights[None], torch.ones(1, T, dtype=torch.bool), torch.ones(1, S, dtype=torch.bool))
    means = statistics.means()
    if cross:
        means = {name: {stat: values for stat, values in row.items() if stat not in _POSITIONAL}
                 for name, row in means.items()}
    return means


def _tables(means: dict[str, dict[str, list]]) -> dict[str, list]:
    names = list(means)
    return {stat: [means[name][stat] for name in names] for stat in next(iter(means.values()))}


def write_pair_inspection(
    model: nn.Module,
    tokenizer: Any,
    source: str,
    out: Union[str, Path],
    *,
    target: Optional[str] = None,
    max_new_tokens: int = 20,
    max_length: int = 512,
    formats: Sequence[str] = ("png",),
    max_tokens: int = 128,
    model_name: str = "model",
    clip: Optional[AudioFeatures] = None,
) -> PairInspection:
    """Run ``source`` and ``target`` (or a target generated from ``source`` when ``target`` is
    ``None``) through an encoder-decoder model and write into ``out``: ``report.html`` (the
    cross-attention, target x source), ``encoder.html``, ``decoder.html``,
    ``cross_layer_<k>.<fmt>`` (each layer's heads, target rows over source columns),
    ``statistics.json``, ``alignment.txt`` (Pharaoh ``source-target`` token links) and, for a
    generated target, ``generation.html`` (step through the generated tokens over the source).

    Args:
        model: a transformers encoder-decoder (a ``TransformersModel`` or the model itself).
        tokenizer: the tokenizer of both sides.
        source: the source text.
        out: output directory (created).
        target: the target text; ``None`` generates one (greedy, ``max_new_tokens``).
        max_new_tokens: tokens generated when ``target`` is ``None``.
        max_length: tokens kept of each side.
        formats: picture formats.
        max_tokens: beyond this many positions pages and pictures pool positions.
        model_name: shown on the pages.
        clip: a speech clip's features (:func:`~attnlab.hf.audio.audio_features`) instead of a source
            text (``source`` then names the clip): the source side is the clip's time, cut to the
            positions it covers and labelled in seconds; the target (greedy when not given, see
            :func:`~attnlab.workflows.inspect_speech.speech_pair`) is labelled as text, and its words'
            times in seconds go to ``words.json`` and the page instead of ``alignment.txt``.
    """
    from ..hf.opening import transformers_module
    from ..hf.seq2seq import decoder_start, generate_pair, pair_attention
    from .inspect_speech import speech_pair

    inner = transformers_module(model)
    speech = None
    if clip is not None:
        speech = speech_pair(inner, tokenizer, clip, target=target, max_new_tokens=max_new_tokens)
        pair, source_tokens = speech.pair, speech.source_tokens
    else:
        source_ids, source_tokens = encode_side(tokenizer, source, max_length, "--source")
        if target is None:
            pair = generate_pair(inner, source_ids, max_new_tokens=max_new_tokens, do_sample=False)
        else:
            target_ids, _ = encode_side(tokenizer, target, max_length - 1, "--target")
            decoder_ids = torch.cat([torch.tensor([decoder_start(inner)]), target_ids])  # [T]: start token first
            pair = pair_attention(inner, source_ids, decoder_ids)
    target_tokens = speech.target_tokens if speech else [_token_text(tokenizer, i) for i in pair.target_ids.tolist()]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sides = ("target", "source") if speech is None else ("target", "time (s)")
    meta = {"model": model_name, "source": source,
            "target": target if target is not None else " ".join(target_tokens[1:]) + "  (generated, greedy)"}
    if speech is not None:
        meta["target"] = (target if target is not None else speech.transcript + "  (generated, greedy)")
        meta["clip"] = f"{clip.seconds:.2f} s: {len(source_tokens)} encoder positions of " \
                       f"{clip.seconds_per_position * 1000:g} ms (the window's padding left out)"
        meta["words (s)"] = _words_line(speech.words) or "(no tokenizer: no words)"
    figures: list[Path] = []
    for index, (name, weights) in enumerate(pair.cross.items(), 1):
        columns = "source (columns)" if speech is None else "time in seconds (columns)"
        figure = plot_layer(weights, target_tokens, key_tokens=source_tokens,
                            title=f"{name}: target (rows) x {columns}", max_tokens=min(max_tokens, 64),
                            key_seconds=None if speech is None else clip.seconds_per_position)
        figures += save_figure(figure, out / f"cross_layer_{index}", formats)
    statistics = {"cross": _statistics(pair.cross, cross=True), "encoder": _statistics(pair.encoder, cross=False),
                  "decoder": _statistics(pair.decoder, cross=False)}
    report = write_report(out / "report.html", pair.cross, target_tokens, key_tokens=source_tokens, sides=sides,
                          title="attnlab cross-attention", meta=meta, statistics=_tables(statistics["cross"]),
                          max_tokens=max_tokens)
    pages = [report]
    pages.append(write_report(out / "encoder.html", pair.encoder, source_tokens, title="encoder self-attention",
                              meta=meta, statistics=_tables(statistics["encoder"]), max_tokens=max_tokens))
    pages.append(write_report(out / "decoder.html", pair.decoder, target_tokens, title="decoder self-attention",
                              meta=meta, statistics=_tables(statistics["decoder"]), max_tokens=max_tokens))
    # decoder position k predicts target_tokens[k + 1]: target token j (after the start token) is row j
    if speech is None:
        links = attention_alignment({name: weights[:, :-1] for name, weights in pair.cross.items()}) if len(
            target_tokens) > 1 else frozenset()
        alignment = format_pharaoh(links)
        (out / "alignment.txt").write_text(alignment + "\n", encoding="utf-8")
        about = {"from": "cross-attention, every layer and head averaged; each target token (counted from 0 after "
                         "the start token) to the source token the decoder attends to most at the step that "
                         "predicts it", "pharaoh": alignment}
    else:
        alignment = _words_line(speech.words)
        write_json(out / "words.json", {"transcript": speech.transcript,
                                        "words": [word.to_dict() for word in speech.words]})
        about = {"from": "word timestamps in seconds, as openai-whisper's: the alignment heads' cross-attention "
                         "over the clip, dynamic time warping", "words": [w.to_dict() for w in speech.words]}
    write_json(out / "statistics.json", {
        "model": model_name, "source_tokens": source_tokens, "target_tokens": target_tokens,
        "layers": {
            name: {"kind": kind, "queries": query_side, "keys": key_side, **values}
            for kind, query_side, key_side in (("encoder", "source", "source"), ("decoder", "target", "target"),
                                               ("cross", "target", "source"))
            for name, values in statistics[kind].items()
        },
        "alignment": about,
    })
    first = 1 if speech is None else len(speech.prompt)  # the rows of generated tokens start here
    if target is None and len(target_tokens) > first:
        G, S = len(target_tokens) - first, len(source_tokens)
        names = list(pair.cross)
        stacked = torch.stack([pair.cross[name] for name in names])  # [L, H, T, S]
        rows = torch.zeros(G, len(names), stacked.shape[1], S + G)  # [G, L, H, N]
        # generated token g was produced at decoder position first - 1 + g (its input: the token before it)
        rows[:, :, :, :S] = stacked[:, :, first - 1:first - 1 + G].permute(2, 0, 1, 3)
        pages.append(write_generation_report(
            out / "generation.html", rows, source_tokens + target_tokens[first:], S, layers=names,
            title="attnlab generation: each target token's cross-attention over the source",
            meta={**meta, "rows": "the cross-attention of the decoder step that produced each token"}))
    return PairInspection(report, pages, figures, source_tokens, target_tokens, pair.cross, alignment)
