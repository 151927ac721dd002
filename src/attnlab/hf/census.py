"""Every architecture the installed transformers provides, tried under attnlab's attention.

Dimension letters: ``B`` batch, ``T`` length.

:func:`census` enumerates transformers' model types (``CONFIG_MAPPING``), builds a tiny
random model of each from its own config class, its sizes shrunk by one rule
(:func:`shrink`) and random weights of ``initializer_range`` 0.2 so that attention is far
from uniform, and gives each one verdict:

* ``served``: under :func:`~attnlab.hf.attach` with no layer chosen the outputs equal
  transformers' ``sdpa`` (``eager`` where the model has no sdpa), every layer's weights under
  ``attach(layers="all")`` equal ``eager``'s, a head masked through ``attach(head_mask=)``
  equals sdpa with that head's output zeroed, and every config has its implementation back
  after the block;
* ``differs``: served, but a check above failed (a defect: the numbers say which);
* ``refused``: ``attach`` refuses it, with the one line a user gets;
* ``not built``: no model to try (no base model class, a sub-config or backbone from
  elsewhere, an optional package, inputs the census does not make): why.

``python -m attnlab.hf.census --out docs/hf_backend_architectures.md`` (``make census``)
writes the table, with the versions in its header.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import math
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
from torch import Tensor, nn

from .census_models import (
    EXTRA_INPUTS,
    OVERRIDES,
    B,
    T,
    NotBuilt,
    first_line,
    model_inputs,
    real_settings,
    run,
    runnable,
    shrink,
)

__all__ = ["KNOWN_DIFFERENCES", "Verdict", "census", "shrink", "write_table"]

TOLERANCE = 1e-5

# Differences the census finds that are not attnlab's defects, each with why; the whole-census
# test (`make test-latest`) fails on any other.
_SINK_CONVENTION = ("known: eager returns each row's weights before the learned sink takes its share; attnlab's "
                    "are the weights that multiply the values (rows sum to 1 less the sink's share), as for gpt-oss")
_EAGER_NAN = "known: attnlab's outputs equal sdpa's, and its weights are finite"
KNOWN_DIFFERENCES = {
    "granite_swa": _SINK_CONVENTION,
    "granitemoe_swa": _SINK_CONVENTION,
    "aimv2_text_model": "known: transformers' own sdpa and eager disagree on this model (outputs by 3.7); "
                        "attnlab's outputs equal sdpa's",
    "nemotron3_5_asr": _EAGER_NAN,
    "nemotron_asr_streaming": _EAGER_NAN,
    "nemotron_asr_streaming_encoder": _EAGER_NAN,
}
@dataclass
class Verdict:
    """One architecture's result.

    Attributes:
        model_type: transformers' name (``llama``).
        verdict: ``served``, ``differs``, ``refused`` or ``not built``.
        model_class: the class tried (``LlamaModel``), when there is one.
        reason: why it was refused or not built, or which check failed.
        outputs: largest difference of the outputs against the reference.
        weights: largest difference of the weights against eager's.
        head_mask: largest difference of the outputs with one head masked against the reference
            with that head's output zeroed (``None``: not checked, where the reference is eager).
        layers: attention layers served (attnlab's names).
        kind: ``decoder``, ``encoder``, ``encoder-decoder``, ``vision``, ``speech``,
            ``vision-language`` or ``two towers`` (empty where no model was built).
        reference: ``sdpa`` or ``eager``.
        seconds: time spent on it.
    """

    model_type: str
    verdict: str
    model_class: str = ""
    reason: str = ""
    outputs: Optional[float] = None
    weights: Optional[float] = None
    head_mask: Optional[float] = None
    layers: list[str] = field(default_factory=list)
    kind: str = ""
    reference: str = ""
    seconds: float = 0.0


def _floating(output: Any) -> list[Tensor]:
    """Every floating tensor of an output (attentions left out), in a fixed order."""
    found = []
    values = output.values() if hasattr(output, "values") else output if isinstance(output, (tuple, list)) else [output]
    for key, value in zip(output.keys(), values) if hasattr(output, "keys") else enumerate(values):
        if isinstance(key, str) and "attention" in key:
            continue
        if isinstance(value, Tensor) and value.is_floating_point():
            found.append(value)
        elif isinstance(value, (tuple, list)) or hasattr(value, "keys"):
            found.extend(_floating(value))
    return found


def _weights(output: Any, prefix: str = "") -> dict[str, tuple]:
    """The output's tuples of attention weights, by field (a tower's output's too:
    ``text_model_output.attentions``)."""
    found = {}
    for key, value in output.items():
        if "attentions" in key and isinstance(value, tuple):
            found[prefix + key] = value
        elif hasattr(value, "items") and not isinstance(value, Tensor):
            found.update(_weights(value, f"{prefix}{key}."))
    return found


def _largest(pairs: Iterable[tuple[Tensor, Tensor]]) -> float:
    worst = 0.0
    for got, want in pairs:
        if got.shape != want.shape:
            return math.inf
        difference = (got.double() - want.double()).abs()
        # a query row with no key: eager's softmax gives NaN, attnlab's zeros (as documented)
        difference = torch.where(want.isnan() & (got == 0), torch.zeros_like(difference), difference)
        worst = max(worst, float(torch.nan_to_num(difference, nan=math.inf).max()) if difference.numel() else 0.0)
    return worst


def _try(model_type: str) -> Verdict:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    from .backend import attach, _configs_of
    from ._kernel import UnsupportedAttention
    from ._sites import attention_sites

    name = MODEL_MAPPING_NAMES.get(model_type)
    if isinstance(name, (tuple, list)):
        name = name[0]
    if name is None:  # a tower's own config (blip_text_model): the class its config's name gives
        name = CONFIG_MAPPING[model_type].__name__.replace("Config", "Model")
    model_class = getattr(transformers, name, None) if name else None
    if model_class is None:
        return Verdict(model_type, "not built", reason=f"transformers has no base model class for it ({name} "
                       f"is not one of its names)")
    verdict = Verdict(model_type, "not built", model_class=model_class.__name__)
    try:
        config = real_settings(shrink(CONFIG_MAPPING[model_type](), OVERRIDES.get(model_type)), model_type)
        torch.manual_seed(0)
        model = model_class(config).eval()
        verdict.kind = _kind(model, config)
    except Exception as error:  # noqa: BLE001  any failure to build is this architecture's verdict
        verdict.reason = f"building it failed: {type(error).__name__}: {first_line(error)}"
        return verdict
    try:  # a refusal is the model's, whatever its inputs
        sites = attention_sites(model)
        with attach(model):
            pass
    except ValueError as refusal:
        verdict.verdict, verdict.reason = "refused", first_line(refusal)
        return verdict
    try:
        forms = model_inputs(model, config)
        for inputs in forms:
            inputs.update(EXTRA_INPUTS.get(model_type, lambda _: {})(inputs))
        inputs = runnable(model, forms)
    except NotBuilt as why:
        verdict.reason = str(why)
        return verdict
    except Exception as error:  # noqa: BLE001  inputs the census cannot make for it
        verdict.reason = f"making its inputs failed: {type(error).__name__}: {first_line(error)}"
        return verdict
    verdict.layers = [site.name for site in sites]
    reference = "sdpa" if getattr(model, "_supports_sdpa", False) else "eager"
    verdict.reference = reference
    try:
        model.set_attn_implementation(reference)
        want = run(model, inputs)
        before = [(config, config._attn_implementation) for config in _configs_of(model)]
        with attach(model):
            got = run(model, inputs)
        restored = [(config, config._attn_implementation) for config in _configs_of(model)] == before
        model.set_attn_implementation("eager")
        eager = run(model, inputs, output_attentions=True)
        with attach(model, layers="all"):
            seen = run(model, inputs, output_attentions=True)
    except UnsupportedAttention as refusal:  # found at the call: a module run twice, an argument not served
        verdict.verdict, verdict.reason = "refused", first_line(refusal)
        return verdict
    except Exception as error:  # noqa: BLE001  a forward that fails is this architecture's verdict
        verdict.reason = f"its forward failed: {type(error).__name__}: {first_line(error)}"
        return verdict
    verdict.outputs = _largest(zip(_floating(got), _floating(want)))
    if len(_floating(got)) != len(_floating(want)):
        verdict.outputs = math.inf
    ours, theirs = _weights(seen), _weights(eager)
    pairs = [(a, b) for key in theirs for a, b in zip(ours.get(key, ()), theirs[key])
             if isinstance(a, Tensor) and isinstance(b, Tensor)]
    verdict.weights = _largest(pairs) if pairs else None
    try:
        verdict.head_mask = _head_mask_difference(model, inputs, sites, reference)
    except Exception as error:  # noqa: BLE001  a head mask that breaks the forward is a defect
        verdict.head_mask = math.inf
        verdict.reason = f"with a head masked its forward failed: {type(error).__name__}: {first_line(error)}"
    problems = [verdict.reason] if verdict.reason else []
    if verdict.outputs > TOLERANCE:
        problems.append(f"outputs differ from {reference}'s by {verdict.outputs:.2g}")
    if verdict.weights is None:
        problems.append("no weights came back with output_attentions=True")
    elif verdict.weights > TOLERANCE and any(bool(b.isnan().any()) for _, b in pairs):
        problems.append("eager's own weights are NaN (transformers' eager path on this model), attnlab's are not: "
                        "the weights cannot be checked against eager")
    elif verdict.weights > TOLERANCE:
        problems.append(f"weights differ from eager's by {verdict.weights:.2g}")
    if verdict.head_mask is not None and verdict.head_mask > TOLERANCE:
        problems.append(f"with a head masked, outputs differ from the head's output zeroed by {verdict.head_mask:.2g}")
    if not restored:
        problems.append("a config kept attnlab's implementation after the block")
    verdict.verdict = "differs" if problems else "served"
    verdict.reason = "; ".join(problems + ([KNOWN_DIFFERENCES[model_type]]
                                           if problems and model_type in KNOWN_DIFFERENCES else []))
    return verdict


_ZEROED = "attnlab_census_zeroed_head"


def _head_mask_difference(model: nn.Module, inputs: dict, sites: list, reference: str, *,
                          masked: int = 1) -> Optional[float]:
    """``attach(head_mask=...)`` on head 2 of the last self-attention layer against the model
    run through transformers' own ``sdpa`` with that head's output zeroed before the output
    projection (a function registered beside sdpa that zeroes it), or ``None`` where the
    reference is eager (the eager function is each modeling file's own)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from .backend import attach, implementation

    site = next((site for site in reversed(sites) if not site.cross and (site.heads or 0) >= 2), None)
    if reference != "sdpa" or site is None:
        return None
    sdpa, head = ALL_ATTENTION_FUNCTIONS["sdpa"], 1

    def zeroed(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any, **kwargs: Any):
        output, weights = sdpa(module, query, key, value, attention_mask, **kwargs)  # output [B, T, H, D]
        if module is site.module:
            output = output.clone()
            output[:, :, head] = 0
        return output, weights

    AttentionInterface.register(_ZEROED, zeroed)
    AttentionMaskInterface.register(_ZEROED, sdpa_mask)
    with implementation(model, _ZEROED):
        want = run(model, inputs)
    with attach(model, head_mask={site.name: [masked]}):  # the head zeroed (another one only to see it fail)
        got = run(model, inputs)
    if len(_floating(got)) != len(_floating(want)):
        return math.inf
    return _largest(zip(_floating(got), _floating(want)))


def _kind(model: nn.Module, config: Any) -> str:
    """What kind of model it is, from its main input, its config and its attention modules."""
    main = getattr(model, "main_input_name", "input_ids")
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    if main in ("input_values", "input_features") or getattr(config, "audio_config", None) is not None:
        return "speech"
    if main in ("pixel_values", "pixel_values_videos"):
        return "vision"
    if getattr(config, "vision_config", None) is not None:
        image_token = any(isinstance(getattr(config, name, None), int) for name in ("image_token_id", "image_token_index"))
        return "vision-language" if image_token else "two towers"
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    causal = any(getattr(module, "is_causal", False) is True for module in model.modules())
    name = getattr(config, "model_type", None)  # a causal language model that is not BERT's kind with an LM head
    language_model = name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and name not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    return "decoder" if causal or language_model or getattr(config, "is_decoder", False) else "encoder"


def census(model_types: Optional[Iterable[str]] = None, *, progress: bool = False) -> list[Verdict]:
    """One :class:`Verdict` per model type of the installed transformers (or of ``model_types``)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.utils import logging as transformers_logging

    names = sorted(CONFIG_MAPPING_NAMES) if model_types is None else list(model_types)
    unknown = [name for name in names if name not in CONFIG_MAPPING_NAMES]
    if unknown:
        raise ValueError(f"unknown model type {unknown[0]!r}: transformers knows {len(CONFIG_MAPPING_NAMES)} "
                         f"(transformers.models.auto.CONFIG_MAPPING_NAMES)")
    verdicts = []
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        for index, name in enumerate(names):
            start = time.perf_counter()
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                verdict = _try(name)
            verdict.seconds = time.perf_counter() - start
            verdicts.append(verdict)
            if progress:
                print(f"[{index + 1}/{len(names)}] {name}: {verdict.verdict} {verdict.reason[:100]}",
                      file=sys.stderr, flush=True)
    finally:
        transformers_logging.set_verbosity(verbosity)
    return verdicts


def _figure(value: Optional[float]) -> str:
    if value is None:
        return "—"
    return "0" if value == 0 else f"{value:.1e}"


KINDS = ("decoder", "encoder", "encoder-decoder", "vision", "speech", "vision-language", "two towers", "")
VERDICTS = ("served", "differs", "refused", "not built")


def _by_kind(verdicts: list[Verdict]) -> list[str]:
    """The totals as a markdown table: one row per kind of model, one column per verdict."""
    lines = ["| kind | " + " | ".join(VERDICTS) + " |", "|---|" + "---|" * len(VERDICTS)]
    for kind in KINDS:
        counts = [sum(v.kind == kind and v.verdict == verdict for v in verdicts) for verdict in VERDICTS]
        if any(counts):
            lines.append(f"| {kind or 'no model built'} | " + " | ".join(map(str, counts)) + " |")
    return lines


def write_table(verdicts: list[Verdict], path: Path) -> None:
    """``docs/hf_backend_architectures.md``: the counts, then one row per architecture."""
    import transformers

    counts = {kind: sum(v.verdict == kind for v in verdicts) for kind in ("served", "differs", "refused", "not built")}
    attentionless = sum("has no attention module" in v.reason for v in verdicts)
    known = sum(v.verdict == "differs" and v.model_type in KNOWN_DIFFERENCES for v in verdicts)
    lines = [
        "# attnlab.hf on every architecture transformers provides",
        "",
        f"Written by `make census` (`python -m attnlab.hf.census`); do not edit by hand. transformers "
        f"{transformers.__version__}, torch {torch.__version__}, Python {platform.python_version()}, CPU, float32.",
        "",
        f"Of {len(verdicts)} model types: **{counts['served']} served** at parity, {counts['differs']} served "
        f"but differing ({known} of them known: a convention or transformers' own sdpa and eager disagreeing, "
        f"said in their rows), {counts['refused']} refused ({attentionless} of them have no attention "
        f"module at all), {counts['not built']} not built.",
        "",
        "Each is a tiny random model built from its own config class (every size shrunk by one rule: 2 layers, "
        "4 heads, 2 key-value heads, width 32, vocabulary 99, 32x32 images; `initializer_range` 0.2; set as the "
        "real checkpoints have it where the class's default differs, `census_models.REAL_SETTINGS`), run on "
        f"{B} sequences of {T} tokens (or images, or audio features). *served*: outputs under `attach(model)` "
        f"equal the reference's (`sdpa`, or `eager` where transformers has no sdpa), every layer's weights under "
        f"`attach(model, layers=\"all\")` equal `eager`'s (tolerance {TOLERANCE:g}), with head 2 of the last "
        "self-attention layer masked the outputs equal the reference run with that head's output zeroed before "
        "the output projection (*head mask*; checked where the reference is sdpa), and every config has its "
        "implementation back after the block. *refused*: `attach`'s one line. *not built*: why there was no "
        "model to try. The hand-picked cases of `tests/parity/test_hf_backend_parity.py` check padded batches "
        "besides.",
        "",
        *_by_kind(verdicts),
        "",
        "| model type | class | kind | verdict | outputs | weights | head mask | attention layers | reason |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for verdict in verdicts:
        layers = f"{len(verdict.layers)}" if verdict.layers else ""
        reason = verdict.reason.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {verdict.model_type} | `{verdict.model_class}` | {verdict.kind} | {verdict.verdict} | "
                     f"{_figure(verdict.outputs)} | {_figure(verdict.weights)} | {_figure(verdict.head_mask)} | "
                     f"{layers} | {reason} |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.hf.census", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    parser.add_argument("--only", nargs="+", default=None, help="these model types only (e.g. llama bert)")
    args = parser.parse_args(argv)
    if args.out is not None:  # checked before minutes of work, not after
        folder = args.out.parent
        if args.out.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
            parser.error(f"--out {args.out}: " + ("a directory, not a file" if args.out.is_dir() else
                                                   f"no writable folder {folder}"))
    if args.only is not None:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        unknown = [name for name in args.only if name not in CONFIG_MAPPING_NAMES]
        if unknown:
            close = difflib.get_close_matches(unknown[0], CONFIG_MAPPING_NAMES, n=3)
            parser.error(f"--only: transformers has no model type {unknown[0]!r}"
                         + (f" (did you mean {', '.join(close)}?)" if close else ""))
    verdicts = census(args.only, progress=True)
    counts = {kind: sum(v.verdict == kind for v in verdicts) for kind in ("served", "differs", "refused", "not built")}
    print(", ".join(f"{count} {kind}" for kind, count in counts.items()))
    if args.out is not None:
        write_table(verdicts, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
