"""``attnlab explain``: per-token scores of one text for each attribution method, or, on a
decoder with ``--prompt``, which earlier tokens made each generated token."""

from __future__ import annotations

import argparse

from ..compute.generation_attribution import GENERATION_METHODS
from ..compute.token_attribution import METHODS
from .resolve import MODEL_HELP, add_dtype_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help=MODEL_HELP
    )
    parser.add_argument("--text", default=None, help="the text to explain (a classifier or encoder)")
    parser.add_argument("--prompt", nargs="+", default=None,
                        help="a decoder's prompt(s): explain what the model generates after each")
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
        choices=list(dict.fromkeys([*METHODS, *GENERATION_METHODS])),
        dest="methods",
        help="attribution methods (default: all six for a classifier; raw, rollout and flow for an encoder; "
             f"with --prompt: {', '.join(GENERATION_METHODS)})",
    )
    parser.add_argument(
        "--target",
        default=None,
        help="class to explain: a label name or a 0-based index (default: the prediction); with --prompt: "
             "one token explained after the prompt (default: the model's own)",
    )
    parser.add_argument("--foil", default=None,
                        help="with --prompt: a token to contrast with: explain log p(target) - log p(foil)")
    parser.add_argument("--steps", type=int, default=50, help="integrated gradients' quadrature points")
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="tokens kept from the text (default: as many as the model takes)",
    )
    add_dtype_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..._files import check_output_dir
    from ..compute.attribution_target import is_causal_model
    from ..compute.integrated_gradients import MAX_STEPS

    if (args.text is None) == (args.prompt is None):
        raise ValueError("give --text (a text to classify) or --prompt (a decoder's prompt to continue), one of them")
    if not 1 <= args.steps <= MAX_STEPS:
        raise ValueError(f"--steps must lie in 1..{MAX_STEPS} (integrated gradients' quadrature points; "
                         f"50-300 is usual), got {args.steps}")
    if args.prompt is not None:
        return _run_generation(args)
    if args.continuation is not None or args.foil is not None:
        raise ValueError("--continuation and --foil go with --prompt (a decoder's prompt); with --text leave them out")
    bad = [name for name in args.methods or () if name not in METHODS]
    if bad:
        raise ValueError(f"--method {bad[0]} explains generated text: use it with --prompt, or choose among "
                         f"{', '.join(METHODS)} for --text")
    from .explain_text import explain, write_explanation
    from .resolve import dtype_line, max_length_for, resolve_model

    check_output_dir(args.out, "--out", "explanation.json, .png and .html")
    resolved = resolve_model(args.model, dtype=args.dtype)
    print(dtype_line(resolved))
    methods = args.methods
    if methods is None:
        classifier = isinstance(getattr(resolved.model, "num_labels", None), int)
        methods = list(METHODS) if classifier else ["raw", "rollout", "flow"]
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
    )
    print(f"{len(explanation.tokens)} tokens; {explanation.describe_target()}")
    for path in write_explanation(explanation, args.out, model_name=args.model):
        print(f"wrote {path}")
    return 0


def _run_generation(args: argparse.Namespace) -> int:
    from ..._files import check_output_dir
    from ..compute.attribution_target import is_causal_model
    from .explain_generation import explain_generation, lens_table, write_generation_explanations
    from .resolve import dtype_line, resolve_model

    bad = [name for name in args.methods or () if name not in GENERATION_METHODS]
    if bad:
        raise ValueError(f"--method {bad[0]} is not a method for generated text; with --prompt choose among "
                         f"{', '.join(GENERATION_METHODS)}")
    if args.max_length is not None:
        raise ValueError("--max-length cuts a --text; with --prompt the whole prompt is explained (shorten --prompt)")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    check_output_dir(args.out, "--out", "explanation.json, .png, .html and logit_lens.png")
    resolved = resolve_model(args.model, dtype=args.dtype)
    print(dtype_line(resolved))
    if not is_causal_model(resolved.model) and not getattr(resolved.model, "is_causal", False):
        raise ValueError(f"--prompt explains what a decoder generates; {args.model} is a "
                         f"{type(resolved.model).__name__} (use --text for a classifier or encoder)")
    explanations = explain_generation(
        resolved.model, resolved.tokenizer, args.prompt, args.methods or GENERATION_METHODS,
        continuation=args.continuation, max_new_tokens=args.max_new_tokens, target=args.target, foil=args.foil,
        steps=args.steps,
        names={"prompts": "--prompt", "continuation": "--continuation", "target": "--target", "foil": "--foil",
               "max_new_tokens": "--max-new-tokens"},
    )
    for explanation in explanations:
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
