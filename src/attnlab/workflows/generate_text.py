"""A prompt in, the continuation and what every generated token attended to out:
what ``attnlab generate`` does.

Dimension letters: ``L`` layers, ``H`` heads, ``N`` final length (prompt + generated).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn

from .._files import json_dumps
from ..inspect.compute.causal_statistics import CAUSAL_STATISTICS, causal_statistics
from ..inspect.compute.inspectable import inspectable
from ..inspect.draw.generation_report import write_generation_report
from ..inspect.draw.report import write_report

__all__ = ["Generation", "decoding_path", "generate_text"]

_TOP = 5  # attended positions listed per head in generation.json


@dataclass
class Generation:
    """What :func:`generate_text` produced.

    Attributes:
        text: the generated continuation.
        prompt_tokens, generated_tokens: the tokens as text.
        report: ``report.html`` when a report directory was given.
        files: every file written.
        decoding: how the decoding steps ran, and why (:func:`decoding_path`).
    """

    text: str
    prompt_tokens: list[str]
    generated_tokens: list[str]
    report: Optional[Path] = None
    files: list[Path] = field(default_factory=list)
    decoding: str = ""


def decoding_path(model: nn.Module, batch: int = 1, *, output_attentions: bool = False,
                  **options: Any) -> str:
    """How ``generate`` runs the decoding steps of ``model`` for ``batch`` rows with these
    options: attnlab's native step, or the path that runs instead and why (the
    ``unserved_reason`` of attnlab's decoders or of transformers' ones)."""
    from ..hf.opening import TransformersModel
    from ..models.decoder import DecoderForCausalLM
    from ..models.decoder.native_decoding import unserved_reason

    active = {key: value for key, value in options.items() if value not in (None, False)}
    if isinstance(model, TransformersModel):
        reason = model.unserved_reason(batch, output_attentions=output_attentions, **active)
        return "attnlab's native decoding step" if reason is None else f"transformers' generate ({reason})"
    if not isinstance(model, DecoderForCausalLM):
        return f"{type(model).__name__}'s own generate"
    if active.get("compile"):
        return "steps compiled by torch.compile (compile=True)"
    reason = unserved_reason(model, batch)
    return "attnlab's native decoding step" if reason is None else f"the modules' forward ({reason})"


def _token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    return [tokenizer.decode([token], skip_special_tokens=False) for token in ids]


def generate_text(
    model: nn.Module,
    tokenizer: Any,
    prompt: str,
    *,
    max_new_tokens: int = 32,
    report_dir: Optional[Union[str, Path]] = None,
    max_tokens: int = 128,
    model_name: str = "model",
    **sampling: Any,
) -> Generation:
    """Generate from ``prompt``; with ``report_dir``, record every token's attention on the way
    and write ``generation.html`` (step through the generated tokens: what each attended to,
    in every layer and head), ``report.html`` (the causal map of prompt and continuation,
    the prompt's own map included), ``generation.json``
    (for each generated token, each layer and head, the most attended positions) and
    ``statistics.json`` (causal statistics per layer and head).

    Args:
        model: a decoder (:class:`~attnlab.models.decoder.DecoderForCausalLM`).
        tokenizer: its tokenizer.
        prompt: the text to continue (already in the model's chat format, if it has one).
        max_new_tokens: tokens to generate.
        report_dir: where to write the report; ``None`` writes nothing and records nothing.
        max_tokens: the report pools positions beyond this many.
        model_name: shown in the report.
        **sampling: ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``seed`` and
            ``compile`` of ``generate``.

    Raises:
        ValueError: the model cannot generate, or the prompt gives no token.
    """
    view = inspectable(model)
    if view.unsupported("generate") is not None:
        raise ValueError(f"{model_name} holds {view.architecture}, not a decoder: generate needs a decoder-only language model "
                         f"(attnlab's GPT-2 and Llama families, or a transformers *ForCausalLM)")
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"prompt must be a non-empty string, got {prompt!r}")
    ids = tokenizer.encode(prompt).ids
    if not ids:
        raise ValueError(f"the tokenizer produced no token for {prompt!r}")
    input_ids = torch.tensor([ids])
    capture = report_dir is not None
    generated = view.generate(input_ids, max_new_tokens=max_new_tokens, output_attentions=capture, **sampling)
    new_ids = generated.sequences[0, len(ids):].tolist()
    result = Generation(tokenizer.decode(new_ids), _token_texts(tokenizer, ids),
                        _token_texts(tokenizer, new_ids),
                        decoding=decoding_path(model, 1, output_attentions=capture, **sampling))
    if not capture:
        return result
    out = Path(report_dir)
    out.mkdir(parents=True, exist_ok=True)
    maps = generated.attention_maps()  # [1, H, N, N] per layer
    names = list(maps.keys())
    tokens = result.prompt_tokens + result.generated_tokens
    statistics = causal_statistics(maps)
    steps = []
    for index in range(len(generated.attentions) - 1):
        rows = generated.generated_attention(index)  # [1, H, S] per layer
        top = {name: [torch.topk(head, min(_TOP, head.shape[-1])).indices.tolist() for head in row[0]]
               for name, row in rows.items()}
        steps.append({"position": len(ids) + index, "token": tokens[len(ids) + index], "top_positions": top})
    (out / "generation.json").write_text(json_dumps(
        {"prompt": prompt, "text": result.text, "tokens": tokens, "prompt_length": len(ids), "steps": steps}),
        encoding="utf-8")
    (out / "statistics.json").write_text(json_dumps(statistics), encoding="utf-8")
    report = write_report(
        out / "report.html",
        {name: maps[name][0].float() for name in names},
        tokens,
        title="attnlab generation report",
        meta={"model": model_name, "prompt": prompt, "generated": result.text,
              "tokens": f"{len(ids)} prompt + {len(new_ids)} generated"},
        statistics={stat: [statistics[stat][name] for name in names] for stat in CAUSAL_STATISTICS},
        max_tokens=max_tokens,
    )
    files = [out / "generation.json", out / "statistics.json", report]
    if new_ids:
        rows = torch.stack([torch.stack(list(maps[name][0, :, len(ids) + step] for name in names))
                            for step in range(len(new_ids))])  # [G, L, H, N]
        files.append(write_generation_report(
            out / "generation.html", rows, tokens, len(ids), layers=names, title="attnlab generation",
            meta={"model": model_name, "prompt": prompt, "generated": result.text}))
    result.report = report
    result.files = files
    return result
