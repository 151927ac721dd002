"""``attnlab analyze``: attention statistics over a data set (texts, or ``--images``: a folder of
pictures for a vision transformer), as JSON, plots and an HTML summary."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ._model_options import MODEL_HELP, add_dtype_argument, add_placement_arguments, placement_from_args


def _heads(value: str) -> tuple[str, list[int]]:
    """``LAYER:H,H`` with layers and heads numbered from 1, as in every report and file;
    returns the layer's name and 0-based head indices for :func:`attnlab.inspect.mask_heads`."""
    usage = f"--mask-heads takes LAYER:HEADS numbered from 1 (e.g. 2:1,4 or layer_2:1,4), got {value!r}"
    try:
        layer, heads = value.split(":")
        layer_number = int(layer.removeprefix("layer_"))
        numbers = [int(head) for head in heads.split(",") if head]
    except ValueError:
        raise argparse.ArgumentTypeError(usage) from None
    if layer_number < 1 or not numbers or min(numbers) < 1:
        raise argparse.ArgumentTypeError(usage)
    return f"layer_{layer_number}", [number - 1 for number in numbers]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help=MODEL_HELP
    )
    parser.add_argument("--data", default=None, help="a .txt/.csv/.jsonl file or 'rotten_tomatoes'")
    parser.add_argument("--images", default=None,
                        help="instead of --data: a folder of PNG/JPEG files for a vision transformer directory "
                             "(ViT, DeiT, DINOv2, CLIP)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--split", default=None, help="split of the embedded data (default: all)")
    parser.add_argument("--text-column", default=None, help="CSV column holding the text")
    parser.add_argument("--limit", type=int, default=None, help="analyse only the first N texts")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=None,
                        help="tokens kept per text (default: as many as the model takes)")
    parser.add_argument(
        "--max-attention-cells",
        type=int,
        default=32 * 64 * 64,
        help="at most this many B*T*T cells a batch: long texts come in smaller batches, "
        "so peak memory does not depend on the data",
    )
    parser.add_argument(
        "--sparsity-threshold", type=float, default=0.1, help="a key counts as unattended below this weight"
    )
    parser.add_argument("--top-k", type=int, default=3, help="k of the top-k attention mass")
    parser.add_argument(
        "--importance",
        action="store_true",
        help="also compute head importance (Michel et al. 2019; needs labels and a classifier)",
    )
    parser.add_argument(
        "--mask-heads",
        type=_heads,
        action="append",
        default=None,
        metavar="LAYER:H,H",
        help="switch heads off, numbered from 1 like every report: 2:1,4 is heads 1 and 4 of layer 2; "
        "repeatable",
    )
    parser.add_argument("--format", nargs="+", default=["png"], choices=["png", "svg"], dest="formats")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--checkpoint-seconds", type=float, default=60.0,
                        help="with --data: keep the partial statistics in OUT/.analysis-partial at least this often "
                        "(and on Ctrl-C or SIGTERM); the same command run again resumes from them (default 60)")
    add_dtype_argument(parser)
    add_placement_arguments(parser)


def check_statistics_options(args: argparse.Namespace) -> None:
    """--top-k, --sparsity-threshold and --max-attention-cells, by their flags, before any work."""
    if args.top_k < 1:
        raise ValueError(f"--top-k must be at least 1 (keys whose mass is summed), got {args.top_k}")
    if not 0 < args.sparsity_threshold <= 1:  # also refuses nan
        raise ValueError(f"--sparsity-threshold must lie in (0, 1] (a weight below it counts as unattended), "
                         f"got {args.sparsity_threshold}")
    if not getattr(args, "checkpoint_seconds", 0) >= 0:  # also refuses nan
        raise ValueError(f"--checkpoint-seconds must be 0 or more, got {args.checkpoint_seconds}")
    if args.max_attention_cells < 1:
        raise ValueError(f"--max-attention-cells must be at least 1 (B*T*T cells a batch), got "
                         f"{args.max_attention_cells}")


def run(args: argparse.Namespace) -> int:
    # imported here so that `attnlab --help` and other subcommands stay quick
    from .._files import check_output_dir
    from ..train.distributed import init_distributed, shutdown_distributed

    if (args.data is None) == (args.images is None):
        raise ValueError("give --data (texts) or --images (a folder of pictures), one of them")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be at least 1, got {args.limit}")
    if args.images is not None:
        return _run_images(args)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    check_statistics_options(args)
    check_output_dir(args.out, "--out", "statistics.json, plots/ and summary.html")
    info = init_distributed()  # under torchrun: each process analyses its shard of the texts
    say = print if info.is_main else (lambda *args, **kwargs: None)
    try:
        return _run_texts(args, say)
    except BaseException:
        shutdown_distributed(wait_for_others=False)
        raise
    finally:
        shutdown_distributed()


def _run_texts(args: argparse.Namespace, say) -> int:
    from ..data.texts import load_texts
    from ..workflows.analyze_texts import write_analysis
    from ..inspect.compute.causal_statistics import BEYOND_WINDOW, describe_window
    from ._model_options import dtype_line
    from ..workflows.resolve import max_length_for, resolve_model

    resolved = resolve_model(args.model, dtype=args.dtype, placement=placement_from_args(args))
    say(dtype_line(resolved))
    max_length = max_length_for(resolved, args.max_length, fallback=128)
    rows = load_texts(args.data, split=args.split, text_column=args.text_column, limit=args.limit,
                      label_names=getattr(resolved.model, "label_names", None))
    if args.text_column is None and Path(args.data).is_file():
        from ..data.text_files import choose_text_column

        column = choose_text_column(args.data)
        if column != "text":  # train reads "text" unless told: say which column these texts came from
            say(f"texts: column {column!r} of {args.data} (--text-column to read another; train needs "
                f"data.text_column={json.dumps(column)})")
    lengths = [len(encoding.ids) for encoding in resolved.tokenizer.encode_batch([text for text, _ in rows])]
    longer = sum(length > max_length for length in lengths)
    if longer:
        say(f"note: {longer} of {len(rows)} texts are longer than {max_length} tokens and are cut there "
            f"(--max-length)")
    analysis = write_analysis(
        resolved.model,
        resolved.tokenizer,
        rows,
        args.out,
        batch_size=args.batch_size,
        max_length=max_length,
        max_attention_cells=args.max_attention_cells,
        sparsity_threshold=args.sparsity_threshold,
        top_k=args.top_k,
        importance=args.importance,
        head_mask=dict(args.mask_heads) if args.mask_heads else None,
        progress=not args.no_progress,
        checkpoint_seconds=args.checkpoint_seconds,
        formats=args.formats,
        model_name=args.model,
        data_name=args.data,
    )
    if analysis is None:  # a process other than the first: process 0 wrote the files
        return 0
    stats = analysis.statistics
    print(f"{stats.examples} texts, {stats.tokens} tokens, {len(stats.layers)} layers")
    if "decoder_input" in stats.settings:
        print(f"note: an encoder-decoder: its decoder read {stats.settings['decoder_input']}")
    window = stats.settings.get("sliding_window")
    if window is not None:
        print(describe_window(stats.statistics.get(BEYOND_WINDOW, {}), window))
    print(f"statistics: {analysis.json}")
    print(f"plots: {analysis.json.parent / 'plots'}")
    print(f"summary: {analysis.summary}")
    return 0


def _run_images(args: argparse.Namespace) -> int:
    from .._files import check_output_dir
    from ..hf.image_analysis import analyze_images, image_files
    from ..data.images import load_image
    from ..hf.vision import image_steps
    from ..workflows.resolve import open_vision_model
    from ..workflows.analyze_texts import write_statistics

    text_only = [flag for flag, value in (("--split", args.split), ("--text-column", args.text_column),
                                          ("--max-length", args.max_length), ("--mask-heads", args.mask_heads))
                 if value is not None] + (["--importance"] if args.importance else [])
    if text_only:
        raise ValueError(f"{text_only[0]} applies to --data (texts); with --images leave it out")
    check_statistics_options(args)
    files = image_files(args.images, limit=args.limit)
    check_output_dir(args.out, "--out", "statistics.json, plots/ and summary.html")
    model, preprocessing = open_vision_model(
        args.model, flag="--images", dtype=args.dtype, placement=placement_from_args(args),
        takes="vision model directory (ViT, DeiT, DINOv2, CLIP: config.json + safetensors)")
    steps = image_steps(model.model, preprocessing=preprocessing)
    images = (load_image(path, argument="--images") for path in files)
    statistics = analyze_images(model, images, steps, sparsity_threshold=args.sparsity_threshold, top_k=args.top_k)
    analysis = write_statistics(statistics, args.out, formats=args.formats, model_name=args.model,
                                data_name=args.images, examples_name="images")
    print(f"{statistics.examples} images, {statistics.tokens} tokens, {len(statistics.layers)} layers")
    print(f"statistics: {analysis.json}")
    print(f"plots: {analysis.json.parent / 'plots'}")
    print(f"summary: {analysis.summary}")
    return 0
