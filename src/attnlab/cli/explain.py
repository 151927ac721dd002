"""``attnlab explain``: per-token scores of one text for each attribution method, or, on a
decoder with ``--prompt``, which earlier tokens made each generated token, or, on a vision
transformer's classifier with ``--image``, which patches made its class."""

from __future__ import annotations

import argparse
from typing import Optional

from ..inspect.compute.generation_attribution import DEFAULT_GENERATION_METHODS, GENERATION_METHODS
from ..inspect.compute.integrated_gradients_baseline import DEFAULT_BASELINE
from ..inspect.compute.token_attribution import DEFAULT_METHODS, METHODS
from ._model_options import MODEL_HELP, add_dtype_argument, add_placement_arguments, placement_from_args

ALL = "all"  # --method all: every method of the kind of input


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help=MODEL_HELP
    )
    parser.add_argument("--text", default=None, help="the text to explain (a classifier or encoder)")
    parser.add_argument("--prompt", nargs="+", default=None,
                        help="a decoder's prompt(s): explain what the model generates after each")
    parser.add_argument("--image", default=None,
                        help="a PNG or JPEG for an image classifier directory (ViT, DeiT, DINOv2 "
                             "...ForImageClassification): grad-attention, rollout and raw attention over the patches")
    parser.add_argument("--continuation", default=None,
                        help="with --prompt: explain this text after the prompt instead of the model's own "
                             "continuation (start it with a space where a word follows)")
    parser.add_argument("--max-new-tokens", type=int, default=8,
                        help="with --prompt: tokens generated and explained (default 8)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--method",
        nargs="+",
        default=None,
        choices=list(dict.fromkeys([*METHODS, *GENERATION_METHODS, ALL])),
        dest="methods",
        help=f"attribution methods, or {ALL} for every method; with --text: {', '.join(METHODS)}; "
             f"with --prompt: {', '.join(GENERATION_METHODS)}. Default: the one benchmarks/faithfulness.py "
             f"ranks most faithful "
             f"for the kind of model (a classifier or a decoder; raw, rollout and flow for a bare encoder)",
    )
    parser.add_argument(
        "--target",
        default=None,
        help="class to explain: a label name or a 0-based index (default: the prediction); with --prompt: "
             "one token explained after the prompt (default: the model's own)",
    )
    parser.add_argument("--foil", default=None,
                        help="with --prompt: a token to contrast with: explain log p(target) - log p(foil)")
    parser.add_argument("--steps", type=int, default=None,
                        help="integrated gradients' quadrature points (default: 50, doubled up to 400 until the "
                             "scores add up to the objective's change within 5%%)")
    parser.add_argument("--baseline", default=None,
                        help="integrated gradients' starting point: pad (the pad or neutral token's embedding), "
                             "zero (the zero vector) or mean (the mean embedding) (default: "
                             f"{DEFAULT_BASELINE}, the most faithful in benchmarks/ig_baselines.py)")
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="tokens kept from the text (default: as many as the model takes)",
    )
    add_dtype_argument(parser)
    add_placement_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from .._files import check_output_dir
    from ..inspect.compute.attribution_target import is_causal_model
    from ..inspect.compute.integrated_gradients import MAX_STEPS
    from ..inspect.compute.integrated_gradients_baseline import check_baseline

    given = [flag for flag, value in (("--text", args.text), ("--prompt", args.prompt), ("--image", args.image))
             if value is not None]
    if len(given) != 1:
        raise ValueError("give --text (a text to classify), --prompt (a decoder's prompt to continue) or --image "
                         f"(a picture for an image classifier), one of them ({' and '.join(given) or 'none'} given)")
    if args.steps is not None and not 1 <= args.steps <= MAX_STEPS:
        raise ValueError(f"--steps must lie in 1..{MAX_STEPS} (integrated gradients' quadrature points; "
                         f"50-300 is usual), got {args.steps}")
    if args.baseline is not None:
        if args.image is not None:
            raise ValueError("--baseline is integrated gradients' starting point, for --text or --prompt; "
                             "with --image leave it out")
        check_baseline(args.baseline, "--baseline")
    baseline = args.baseline or DEFAULT_BASELINE
    if args.prompt is not None:
        return _run_generation(args, baseline)
    if args.image is not None:
        return _run_image(args)
    if args.continuation is not None or args.foil is not None:
        raise ValueError("--continuation and --foil go with --prompt (a decoder's prompt); with --text leave them out")
    bad = [name for name in args.methods or () if name not in (*METHODS, ALL)]
    if bad:
        raise ValueError(f"--method {bad[0]} explains generated text: use it with --prompt, or choose among "
                         f"{', '.join(METHODS)} for --text")
    from ..workflows.explain_text import explain, write_explanation
    from ._model_options import dtype_line
    from ..workflows.resolve import max_length_for, resolve_model

    check_output_dir(args.out, "--out", "explanation.json, .png and .html")
    resolved = resolve_model(args.model, dtype=args.dtype, placement=placement_from_args(args))
    resolved.refuse_encoder_decoder("explain scores one sequence's tokens",
                                    "attnlab inspect --source/--target draws its cross-attention")
    print(dtype_line(resolved))
    methods = _every_method(args.methods, METHODS)
    if methods is None:
        classifier = isinstance(getattr(resolved.model, "num_labels", None), int)
        methods = (_default_methods("classifier", resolved.model, METHODS) if classifier
                   else ["raw", "rollout", "flow"])
        if not classifier:
            print("note: the model has no classifier; the gradient methods need one (raw, rollout, flow only)")
    if is_causal_model(resolved.model):
        print("note: a causal decoder: the scores are the last token's attention (what predicts the next token); "
              "--prompt explains what it generates")
    max_length = max_length_for(resolved, args.max_length, fallback=512)
    total = len(resolved.tokenizer.encode(args.text).ids)
    if total > max_length:
        print(f"note: the text has {total} tokens; the first {max_length} are explained (--max-length)")
    explanation = explain(
        resolved.model,
        resolved.tokenizer,
        args.text,
        methods,
        target=args.target,
        max_length=max_length,
        steps=args.steps,
        baseline=baseline,
    )
    print(f"{len(explanation.tokens)} tokens; {explanation.describe_target()}")
    _completeness_line(explanation.completeness())
    for path in write_explanation(explanation, args.out, model_name=args.model):
        print(f"wrote {path}")
    return 0


def _run_generation(args: argparse.Namespace, baseline: str) -> int:
    from .._files import check_output_dir
    from ..inspect.compute.attribution_target import is_causal_model
    from ..workflows.explain_generation import explain_generation, lens_table, write_generation_explanations
    from ._model_options import dtype_line
    from ..workflows.resolve import resolve_model

    bad = [name for name in args.methods or () if name not in (*GENERATION_METHODS, ALL)]
    if bad:
        raise ValueError(f"--method {bad[0]} is not a method for generated text; with --prompt choose among "
                         f"{', '.join(GENERATION_METHODS)}")
    if args.max_length is not None:
        raise ValueError("--max-length cuts a --text; with --prompt the whole prompt is explained (shorten --prompt)")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    check_output_dir(args.out, "--out", "explanation.json, .png, .html and logit_lens.png")
    resolved = resolve_model(args.model, dtype=args.dtype, placement=placement_from_args(args))
    resolved.refuse_encoder_decoder("--prompt explains a decoder-only language model's continuation",
                                    "attnlab generate --prompt continues it, attnlab inspect --source/--target "
                                    "draws its cross-attention")
    print(dtype_line(resolved))
    if not is_causal_model(resolved.model) and not getattr(resolved.model, "is_causal", False):
        raise ValueError(f"--prompt explains what a decoder generates; {args.model} is a "
                         f"{type(resolved.model).__name__} (use --text for a classifier or encoder)")
    methods = (_every_method(args.methods, GENERATION_METHODS)
               or _default_methods("decoder", resolved.model, GENERATION_METHODS))
    explanations = explain_generation(
        resolved.model, resolved.tokenizer, args.prompt, methods,
        continuation=args.continuation, max_new_tokens=args.max_new_tokens, target=args.target, foil=args.foil,
        steps=args.steps, baseline=baseline,
        names={"baseline": "--baseline",
               "prompts": "--prompt", "continuation": "--continuation", "target": "--target", "foil": "--foil",
               "max_new_tokens": "--max-new-tokens"},
    )
    for explanation in explanations:
        _completeness_line(explanation.completeness())
        print(f"prompt {explanation.prompt!r}: explained {''.join(explanation.generated)!r} "
              f"({explanation.objective_name}: {', '.join(f'{v:.3f}' for v in explanation.objective)})")
        for name, rows in explanation.scores.items():
            last = rows[0][: explanation.prompt_length]
            best = max(range(len(last)), key=lambda i: last[i])
            print(f"  {name}: first token's strongest source {explanation.tokens[best]!r} ({last[best]:.3f})")
        table = lens_table(explanation)
        if table:
            print("  logit lens (top token | rank and probability of the generated token):")
            print("\n".join("    " + line for line in table.splitlines()))
    for path in write_generation_explanations(explanations, args.out, model_name=args.model):
        print(f"wrote {path}")
    return 0


def _every_method(given, available) -> Optional[list[str]]:
    """``--method``'s names, ``all`` standing for every one of ``available``; ``None`` when not given."""
    if given is None:
        return None
    return list(available) if ALL in given else list(given)


def _default_methods(kind: str, model, available) -> list[str]:
    """The method the faithfulness benchmark ranked best for ``kind`` (and the model's family, where
    measured), said in one line; every method when nothing was measured."""
    from ..inspect.compute.attn_lrp_rules import refusal
    from ..inspect.faithfulness import faithfulness_for, model_family
    from ..inspect.faithfulness_notes import describe_method

    if refusal(model) is not None:  # a module AttnLRP's rules do not know: it cannot be the default
        available = [name for name in available if name != "attn-lrp"]
    measured = faithfulness_for(kind, model_family(model))
    best = None if measured is None else measured.best_method(available)
    if best is None:
        return list(available)
    print(f"method: {best}, ranked most faithful over the measured models of this kind "
          f"({describe_method(measured, best)}); --method all runs every method")
    return [best]


def _completeness_line(note) -> None:
    """Say how far integrated gradients' scores add up to the objective's change (a warning over 5 %)."""
    if note is not None:
        print(f"integrated gradients: {note}")


def _run_image(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .._files import check_output_dir
    from ..hf.image_explanation import IMAGE_METHODS
    from ..data.images import load_image
    from ..workflows.resolve import open_vision_model
    from ..workflows.explain_image import write_image_explanation

    bad = [name for name in args.methods or () if name not in (*IMAGE_METHODS, ALL)]
    if bad:
        raise ValueError(f"--method {bad[0]} does not explain an image; with --image choose among "
                         f"{', '.join(IMAGE_METHODS)}")
    if args.continuation is not None or args.foil is not None or args.max_length is not None:
        raise ValueError("--continuation, --foil and --max-length go with text; with --image leave them out")
    check_output_dir(args.out, "--out", "explanation.png, explanation.json and report.html")
    image = load_image(args.image, argument="--image")
    model, preprocessing = open_vision_model(
        args.model, flag="--image", dtype=args.dtype, placement=placement_from_args(args),
        takes="image classifier directory (ViT, DeiT, DINOv2 ...ForImageClassification: config.json + safetensors)")
    written = write_image_explanation(model, image, args.out,
                                      methods=_every_method(args.methods, IMAGE_METHODS) or IMAGE_METHODS,
                                      target=args.target, preprocessing=preprocessing, model_name=args.model,
                                      image_name=Path(args.image).name)
    explanation = written.explanation
    gh, gw = explanation.grid
    print(f"{gh} x {gw} patches; explained class {explanation.label!r} (index {explanation.target}, "
          f"p = {explanation.probability:.3f})")
    for name, scores in explanation.maps.items():
        row, column = divmod(int(scores.flatten().argmax()), gw)
        print(f"  {name}: strongest patch at row {row + 1}, column {column + 1} (from 1)")
    for path in written.figures:
        print(f"wrote {path}")
    print(f"report: {written.report}")
    return 0
