"""``attnlab explain``: per-token scores of one text for each attribution method."""

from __future__ import annotations

import argparse

from ..compute.token_attribution import METHODS
from .resolve import MODEL_HELP, add_dtype_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help=MODEL_HELP
    )
    parser.add_argument("--text", required=True, help="the text to explain")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--method",
        nargs="+",
        default=None,
        choices=METHODS,
        dest="methods",
        help="attribution methods (default: all six for a classifier; raw, rollout and flow for an encoder)",
    )
    parser.add_argument(
        "--target",
        default=None,
        help="class to explain: a label name or a 0-based index (default: the prediction)",
    )
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
    from .explain_text import explain, write_explanation
    from .resolve import dtype_line, max_length_for, resolve_model

    if not 1 <= args.steps <= MAX_STEPS:
        raise ValueError(f"--steps must lie in 1..{MAX_STEPS} (integrated gradients' quadrature points; "
                         f"50-300 is usual), got {args.steps}")
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
        print("note: a causal decoder: the scores are the last token's attention (what predicts the next token)")
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
