"""``attnlab inspect``: pictures and the interactive report of one text's attention."""

from __future__ import annotations

import argparse

from .resolve import MODEL_HELP, add_dtype_argument


def _window(value: str) -> tuple[int, int]:
    try:
        start, stop = (int(part) for part in value.split(":"))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--window must be START:STOP, got {value!r}") from error
    return start, stop


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help=MODEL_HELP
    )
    parser.add_argument("--text", required=True, help="the text to inspect")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--layer", type=int, default=None, help="1-based layer of the single-head picture (default: last)"
    )
    parser.add_argument("--head", type=int, default=1, help="1-based head of the single-head picture")
    parser.add_argument(
        "--format",
        nargs="+",
        default=["png", "svg"],
        choices=["png", "svg"],
        dest="formats",
        help="picture formats",
    )
    parser.add_argument("--max-length", type=int, default=None,
                        help="tokens kept from the text (default: as many as the model takes)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=128,
        help="beyond this many positions, pictures and report pool neighbouring positions",
    )
    parser.add_argument(
        "--window", type=_window, default=None, help="START:STOP positions of the single-head picture"
    )
    add_dtype_argument(parser)


def run(args: argparse.Namespace) -> int:
    # imported here so that `attnlab --help` and other subcommands stay quick
    from ..._files import check_output_dir
    from .inspect_text import write_inspection
    from .resolve import dtype_line, max_length_for, resolve_model

    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1 (positions shown before pooling), got {args.max_tokens}")
    if args.window is not None and not 0 <= args.window[0] < args.window[1]:
        raise ValueError(f"--window START:STOP needs 0 <= START < STOP, got {args.window[0]}:{args.window[1]}")
    if args.layer is not None and args.layer < 1 or args.head < 1:
        raise ValueError(f"--layer and --head count from 1, got --layer {args.layer} --head {args.head}")
    check_output_dir(args.out, "--out", "the pictures and report.html")
    resolved = resolve_model(args.model, dtype=args.dtype)
    print(dtype_line(resolved))
    max_length = max_length_for(resolved, args.max_length, fallback=512)
    total = len(resolved.tokenizer.encode(args.text).ids)
    if total > max_length:
        print(f"note: the text has {total} tokens; the first {max_length} are inspected (--max-length)")
    inspection = write_inspection(
        resolved.model,
        resolved.tokenizer,
        args.text,
        args.out,
        layer=args.layer,
        head=args.head,
        formats=args.formats,
        max_length=max_length,
        window=args.window,
        max_tokens=args.max_tokens,
        model_name=args.model,
    )
    print(f"{len(inspection.tokens)} tokens, {len(inspection.attentions)} layers")
    for path in inspection.figures:
        print(f"wrote {path}")
    print(f"report: {inspection.report}")
    return 0
