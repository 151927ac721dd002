"""``attnlab compare``: two models' per-head attention statistics side by side, with differences."""

from __future__ import annotations

import argparse

from ._model_options import MODEL_HELP, add_dtype_argument, add_placement_arguments, placement_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        action="append",
        dest="models",
        metavar="MODEL",
        help=MODEL_HELP + "; give it twice (A, then B)",
    )
    parser.add_argument("--data", required=True, help="a .txt/.csv/.jsonl file or 'rotten_tomatoes'")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--split", default=None, help="split of the embedded data (default: all)")
    parser.add_argument("--text-column", default=None, help="CSV column holding the text")
    parser.add_argument("--limit", type=int, default=None, help="only the first N texts")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="tokens kept per text (default: as many as both models take)",
    )
    parser.add_argument(
        "--importance",
        action="store_true",
        help="also compare head importance (needs labels and classifiers)",
    )
    add_dtype_argument(parser)
    add_placement_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from .._files import check_output_dir
    from ..data.texts import load_texts
    from ..workflows.compare_models import compare_models, write_comparison
    from ._model_options import dtype_line
    from ..workflows.resolve import max_length_for, resolve_model

    if len(args.models) != 2:
        raise ValueError(f"--model must be given exactly twice (A and B), got {len(args.models)}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be at least 1, got {args.limit}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    check_output_dir(args.out, "--out", "comparison.json and .html")
    placement = placement_from_args(args)  # each model's offloaded layers in a folder of its own: DIR/A, DIR/B
    resolved = [resolve_model(spec, dtype=args.dtype, placement=None if placement is None else placement.within(which))
                for spec, which in zip(args.models, "AB")]
    print("; ".join(dtype_line(model) for model in resolved))
    max_length = min(max_length_for(model, args.max_length, fallback=128) for model in resolved)
    names_a, names_b = (getattr(model.model, "label_names", None) for model in resolved)
    if args.importance and names_a and names_b and list(names_a) != list(names_b):
        # the file's labels become class ids by model A's names; B would be scored against A's classes
        raise ValueError(f"--importance: model A names its classes {list(names_a)}, model B {list(names_b)}; "
                         f"the labels can be read for one of them only: compare models with the same classes")
    rows = load_texts(args.data, split=args.split, text_column=args.text_column, limit=args.limit,
                      label_names=names_a)
    comparison = compare_models(
        resolved[0].model,
        resolved[0].tokenizer,
        resolved[1].model,
        resolved[1].tokenizer,
        rows,
        names=(args.models[0], args.models[1]),
        batch_size=args.batch_size,
        max_length=max_length,
        importance=args.importance,
    )
    for name, values in comparison.result["summary"].items():
        change = values["mean_abs_difference"]
        print(f"{name}: mean |B - A| = {'n/a' if change is None else f'{change:.4g}'}")
    for path in write_comparison(comparison, args.out, data_name=args.data):
        print(f"wrote {path}")
    return 0
