"""``attnlab inspect``: pictures and the interactive report of one text's attention, of a
source/target pair through an encoder-decoder (``--source --target``), of an image through a
vision transformer (``--image``), or of a speech clip through Whisper (``--audio``)."""

from __future__ import annotations

import argparse

from ._model_options import MODEL_HELP, add_dtype_argument, add_placement_arguments, placement_from_args


def _window(value: str) -> tuple[int, int]:
    try:
        start, stop = (int(part) for part in value.split(":"))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--window must be START:STOP, got {value!r}") from error
    return start, stop


def _rows(value: str):
    """``--rows``: ``last:K``, ``START:STOP`` (negative counts from the end) or ``P,Q,...``."""
    text = value.strip()
    try:
        if text.startswith("last:"):
            return int(text[len("last:"):])
        if ":" in text:
            start, stop = (int(part) if part.strip() else None for part in text.split(":"))
            return slice(start, stop)
        return [int(part) for part in text.split(",")]
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"--rows must be last:K, START:STOP or positions P,Q,... (e.g. last:16, 1000:1100, 0,-1), "
            f"got {value!r}") from error


def _size(value: str) -> tuple[int, int]:
    try:
        height, width = (int(part) for part in value.lower().split("x"))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--image-size must be HxW in pixels, got {value!r}") from error
    if height < 1 or width < 1:
        raise argparse.ArgumentTypeError(f"--image-size must be positive, got {value!r}")
    return height, width


def _check_inputs(args: argparse.Namespace) -> str:
    """Which input the command was given: ``text``, ``pair``, ``image`` or ``audio`` (exactly one)."""
    given = [flag for flag, value in (("--text", args.text), ("--source", args.source), ("--image", args.image),
                                      ("--audio", args.audio))
             if value is not None]
    if len(given) != 1:
        raise ValueError(f"give one input: --text, --source with --target, --image or --audio "
                         f"({'none' if not given else ' and '.join(given)} given)")
    if args.audio is None and (args.source is None) != (args.target is None):
        raise ValueError("--source and --target go together (an encoder-decoder's pair); "
                         "`attnlab generate --prompt SOURCE` generates a target")
    if args.image is None and (args.image_size is not None or args.discard_ratio != 0.9 or args.head_fusion != "max"):
        raise ValueError("--image-size, --head-fusion and --discard-ratio apply to --image only")
    if not 0.0 <= args.discard_ratio < 1.0:
        raise ValueError(f"--discard-ratio must lie in [0, 1), got {args.discard_ratio}")
    if args.rows is not None and not (args.text is not None):
        raise ValueError("--rows applies to --text (chosen query rows of one text)")
    if args.rows is not None and args.window is not None:
        raise ValueError("--rows and --window both choose what is drawn: give one")
    if args.prompt is not None and args.image is None:
        raise ValueError("--prompt goes with --image (a vision-language model's prompt about the picture); "
                         "for a text alone give --text")
    if args.prompt is not None and (args.image_size is not None or args.discard_ratio != 0.9
                                    or args.head_fusion != "max"):
        raise ValueError("--image-size, --head-fusion and --discard-ratio apply to --image without --prompt")
    if args.audio is None and args.prompt is None and args.max_new_tokens is not None:
        raise ValueError("--max-new-tokens applies to --audio (a transcript generated from the clip) and to "
                         "--image with --prompt")
    return {"--text": "text", "--source": "pair", "--image": "image", "--audio": "audio"}[given[0]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help=MODEL_HELP
    )
    parser.add_argument("--text", default=None, help="the text to inspect")
    parser.add_argument("--source", default=None,
                        help="with --target: a source text for an encoder-decoder model (T5, BART, Marian)")
    parser.add_argument("--target", default=None,
                        help="with --source: its target text; with --audio: a transcript to score instead of "
                             "the model's own")
    parser.add_argument("--audio", default=None,
                        help="a PCM WAV clip for a speech model directory (Whisper): the cross-attention of the "
                             "transcript over the clip's time, both self-attentions")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="with --audio and no --target: tokens of the greedy transcript (default 20); with "
                             "--image and --prompt: tokens generated (default 8)")
    parser.add_argument("--image", default=None,
                        help="a PNG or JPEG for a vision transformer directory (ViT, DeiT, DINOv2, CLIP)")
    parser.add_argument("--prompt", default=None,
                        help="with --image on a vision-language model directory (LLaVA, Idefics 3, SmolVLM, Qwen2-VL): the "
                             "prompt, in the model's chat format (<image> marks where the image goes, else first); "
                             "draws what each generated token looked at in the picture")
    parser.add_argument("--image-size", type=_size, default=None, metavar="HxW",
                        help="with --image: resize to HxW pixels (default the model's size; other sizes "
                             "interpolate the position embeddings)")
    parser.add_argument("--head-fusion", default="max", choices=["mean", "max", "min"],
                        help="with --image: how the rollout merges heads (default max, as vit-explain)")
    parser.add_argument("--discard-ratio", type=float, default=0.9,
                        help="with --image: share of each layer's smallest fused weights the rollout drops")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--layer", type=int, default=None,
        help="1-based layer of the single-head picture (default: last); with --image and --prompt: the language "
             "model's layer to show (default the mean of all)"
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
    parser.add_argument(
        "--rows", type=_rows, default=None, metavar="SPEC",
        help="with --text: draw only these query rows' exact weights over every key, for long texts (no "
             "T x T map is made): last:K (the last K tokens), START:STOP (a span; write --rows=-16: for a "
             "negative start) or positions P,Q,... (0,-1)",
    )
    add_dtype_argument(parser)
    add_placement_arguments(parser)


def run(args: argparse.Namespace) -> int:
    # imported here so that `attnlab --help` and other subcommands stay quick
    from .._files import check_output_dir
    from ..workflows.inspect_text import write_inspection
    from ._model_options import dtype_line
    from ..workflows.resolve import max_length_for, resolve_model

    kind = _check_inputs(args)
    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1 (positions shown before pooling), got {args.max_tokens}")
    if args.window is not None and not 0 <= args.window[0] < args.window[1]:
        raise ValueError(f"--window START:STOP needs 0 <= START < STOP, got {args.window[0]}:{args.window[1]}")
    if args.layer is not None and args.layer < 1:
        raise ValueError(f"--layer counts from 1 (layer_1 is the first), got --layer {args.layer}")
    if args.head < 1:
        raise ValueError(f"--head counts from 1 (head 1 is the first), got --head {args.head}")
    check_output_dir(args.out, "--out", "the pictures and report.html")
    if kind == "image" and args.prompt is not None:
        return _run_vision_language(args)
    if kind == "image":
        return _run_image(args)
    if kind == "audio":
        return _run_audio(args)
    resolved = resolve_model(args.model, dtype=args.dtype, placement=placement_from_args(args))
    print(dtype_line(resolved))
    max_length = max_length_for(resolved, args.max_length, fallback=512)
    if kind == "pair":
        return _run_pair(args, resolved, max_length)
    resolved.refuse_encoder_decoder("--text draws one sequence's attention",
                                    "give --source (and --target) to draw its encoder, decoder and cross maps")
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
        rows=args.rows,
    )
    print(f"{len(inspection.tokens)} tokens, {len(inspection.attentions)} layers")
    for path in inspection.figures:
        print(f"wrote {path}")
    print(f"report: {inspection.report}")
    return 0


def _run_pair(args: argparse.Namespace, resolved, max_length: int) -> int:
    from ..workflows.inspect_pair import write_pair_inspection

    if not resolved.is_encoder_decoder:
        raise ValueError(f"--source/--target need an encoder-decoder model (T5, BART, Marian); {args.model} is not "
                         f"one: give --text")
    inspection = write_pair_inspection(resolved.model, resolved.tokenizer, args.source, args.out,
                                       target=args.target, max_length=max_length, formats=args.formats,
                                       max_tokens=args.max_tokens, model_name=args.model)
    print(f"{len(inspection.source_tokens)} source and {len(inspection.target_tokens)} target tokens, "
          f"{len(inspection.cross)} cross-attention layers")
    print(f"alignment (source-target tokens, the target counted after its start token): {inspection.alignment}")
    for path in inspection.figures + inspection.pages[1:]:
        print(f"wrote {path}")
    print(f"report: {inspection.report}")
    return 0


def _run_image(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..data.images import load_image
    from ..workflows.resolve import open_vision_model
    from ..workflows.inspect_image import write_image_inspection
    from ..workflows.inspect_vision_language import refuse_unlaid_vision_language, vision_language_type

    image = load_image(args.image, argument="--image")
    language = vision_language_type(args.model)
    if language is not None:
        refuse_unlaid_vision_language(args.model, language)
        raise ValueError(f"{args.model} is a vision-language model ({language}): give --prompt with the question "
                         f"about the picture, and attnlab draws what each generated token looked at in it")
    model, preprocessing = open_vision_model(
        args.model, flag="--image", dtype=args.dtype, resized=bool(args.image_size),
        placement=placement_from_args(args),
        takes="vision model directory (ViT, DeiT, DINOv2, CLIP: config.json + safetensors)")
    inspection = write_image_inspection(model, image, args.out, size=args.image_size, head_fusion=args.head_fusion,
                                        discard_ratio=args.discard_ratio, model_name=args.model,
                                        image_name=Path(args.image).name, preprocessing=preprocessing)
    grid = inspection.grid
    print(f"{grid[0]} x {grid[1]} patches, {inspection.prefix} token(s) before them, "
          f"{len(inspection.class_maps)} layers")
    named = ", ".join(f"({token.row}, {token.column}) at {token.norm_ratio:.1f} x the median norm"
                      for token in inspection.artifact_tokens)
    print(f"artifact tokens (high-norm patches, row and column): {named or 'none'}")
    for path in inspection.figures:
        print(f"wrote {path}")
    print(f"report: {inspection.report}")
    return 0


def _run_vision_language(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..data.images import load_image
    from ..workflows.inspect_vision_language import open_vision_language_model, write_vision_language_inspection

    new_tokens = 8 if args.max_new_tokens is None else args.max_new_tokens
    if new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {new_tokens}")
    if not args.prompt.strip():
        raise ValueError("--prompt is empty: give the question or instruction about the picture")
    image = load_image(args.image, argument="--image")
    model, tokenizer, preprocessing, settings = open_vision_language_model(args.model, dtype=args.dtype,
                                                                           placement=placement_from_args(args))
    layers = None if args.layer is None else [args.layer]
    inspection = write_vision_language_inspection(
        model, tokenizer, image, args.prompt, args.out, max_new_tokens=new_tokens, layers=layers,
        preprocessing=preprocessing, settings=settings, model_name=args.model, image_name=Path(args.image).name)
    print(f"{inspection.image_tokens} image tokens on {len(inspection.tiles)} tile(s) "
          f"({', '.join(inspection.tiles)}); generated: {''.join(inspection.tokens)!r}")
    for path in inspection.figures:
        print(f"wrote {path}")
    return 0


def _run_audio(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..checkpoints.encoders.loading import load_tokenizer
    from ..data.audio import read_wav
    from ..hf.audio import audio_features
    from ..workflows.inspect_pair import write_pair_inspection
    from ..workflows.inspect_speech import open_speech_model

    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    samples, rate = read_wav(args.audio, argument="--audio")
    model = open_speech_model(args.model, dtype=args.dtype, placement=placement_from_args(args))
    inner = model.model
    print(f"{args.model}: {type(inner).__name__} through transformers, attention served by attnlab")
    try:
        tokenizer = load_tokenizer(args.model)
    except FileNotFoundError:
        if args.target is not None:
            raise ValueError(f"--target needs a tokenizer.json in {args.model}") from None
        tokenizer = None
        print(f"note: {args.model} has no tokenizer.json; target tokens are shown by their ids")
    clip = audio_features(args.model, inner, samples, rate)
    print(f"{Path(args.audio).name}: {clip.seconds:.2f} s at {rate} Hz -> {clip.features.shape[0]} mel channels x "
          f"{clip.features.shape[1]} frames (the model directory's feature extractor)")
    clip.features = clip.features.to(next(inner.parameters()).dtype)
    inspection = write_pair_inspection(model, tokenizer, Path(args.audio).name, args.out, target=args.target,
                                       max_new_tokens=args.max_new_tokens or 20, formats=args.formats,
                                       max_tokens=args.max_tokens, model_name=args.model, clip=clip)
    if args.target is None:
        print(f"transcript (greedy, the model's own first choices): {''.join(inspection.target_tokens[1:])!r}")
    print(f"{len(inspection.source_tokens)} encoder positions of the clip ({clip.seconds_per_position * 1000:.0f} ms "
          f"each) and {len(inspection.target_tokens)} target tokens, {len(inspection.cross)} cross-attention layers")
    if inspection.alignment:
        print(f"words (start-end in seconds): {inspection.alignment}")
    for path in inspection.figures + inspection.pages[1:]:
        print(f"wrote {path}")
    print(f"report: {inspection.report}")
    return 0
