"""``attnlab align``: word alignments in the Pharaoh format, and their score against a gold file.

Two uses:

* ``attnlab align --alignments PRED --gold GOLD``: AER, precision and recall of a Pharaoh
  file (one ``i-j`` line per sentence pair) against a gold file (``i-j`` sure, ``i?j``
  possible links).
* ``attnlab align --model DIR --pairs PAIRS --out PRED [--gold GOLD]``: align every
  ``source ||| target`` line of ``PAIRS`` with an encoder-decoder model, by its
  cross-attention (``--method attention``, ``--layers`` / ``--heads`` or all averaged) or by
  its encoder's and decoder's hidden states at ``--hidden-layer`` (``--method argmax`` /
  ``itermax``, SimAlign's); writes ``PRED`` and scores it when ``--gold`` is given.

Which decoder row stands for target token ``k``: the decoder reads ``[start, t_0, t_1, ...]``;
the row at position ``k`` is the step that *predicts* ``t_k`` (``--rows predicting``, the
default: the step that emits a word is where its source is looked at, the reading of attention
as alignment since Bahdanau et al.), the row at ``k + 1`` the step that *reads* it
(``--rows reading``). ``benchmarks/alignment.py`` measures both on a model that learns a
reordering: AER 0.04-0.10 by the predicting rows, about 0.8 (chance) by the reading rows.

Words are whitespace-separated; links count words from 0 (source first). A word split
into several tokens gets the mean over its tokens.

A speech model aligns words with time instead: ``attnlab align --model WHISPER_DIR --audio CLIP.wav
--out WORDS.json [--target TEXT]`` writes each word of the transcript (the model's greedy one, or
``--target``) with its start and end in seconds, from the alignment heads' cross-attention and dynamic
time warping, as openai-whisper's ``word_timestamps``.
"""

from __future__ import annotations

import argparse
import json

from ._model_options import add_dtype_argument, add_placement_arguments, placement_from_args

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--alignments", default=None, help="a Pharaoh file to score (one line per sentence pair)")
    parser.add_argument("--gold", default=None, help="the gold Pharaoh file: i-j sure, i?j possible links")
    parser.add_argument("--model", default=None, help="an encoder-decoder directory (T5, BART, Marian) to align with")
    parser.add_argument("--pairs", default=None, help="with --model: one 'source ||| target' line per pair")
    parser.add_argument("--audio", default=None,
                        help="with --model on a speech model (Whisper): a PCM WAV clip; --out gets its words' "
                             "start and end in seconds (JSON)")
    parser.add_argument("--target", default=None,
                        help="with --audio: the transcript to time (default the model's greedy transcript)")
    parser.add_argument("--out", default=None, help="with --model: the Pharaoh file written")
    parser.add_argument("--method", default="attention", choices=["attention", "argmax", "itermax"],
                        help="cross-attention (default), or SimAlign's argmax / itermax on hidden states")
    parser.add_argument("--layers", default=None,
                        help="with --method attention: cross-attention layers averaged, e.g. 2,3 (from 1; default all)")
    parser.add_argument("--heads", default=None, help="with --method attention: heads averaged, e.g. 1,4 (from 1)")
    parser.add_argument("--rows", default="predicting", choices=["predicting", "reading"],
                        help="with --method attention: the decoder rows that stand for each target token: the step "
                             "that predicts it (default) or the step that reads it")
    parser.add_argument("--hidden-layer", type=int, default=None,
                        help="with argmax/itermax: the layer whose hidden states are compared (default the middle)")
    add_dtype_argument(parser)
    add_placement_arguments(parser)


def _numbers(value: str, flag: str) -> list[int]:
    try:
        numbers = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be numbers from 1 separated by commas, got {value!r}") from None
    if not numbers or min(numbers) < 1:
        raise ValueError(f"{flag} counts from 1, got {value!r}")
    return numbers


def _read_pairs(path: str) -> list[tuple[list[str], list[str]]]:
    from pathlib import Path

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--pairs {path!r}: no such file")
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise ValueError(f"--pairs {file.name} is not UTF-8 text (a WAV clip goes to --audio, with a Whisper "
                         f"--model)") from None
    pairs = []
    for number, line in enumerate(lines, 1):
        parts = line.split("|||")
        if len(parts) != 2 or not parts[0].split() or not parts[1].split():
            raise ValueError(f"--pairs {file.name} line {number}: expected 'source words ||| target words'")
        pairs.append((parts[0].split(), parts[1].split()))
    return pairs


def _pieces(tokenizer, words: list[str]) -> tuple[list[int], list]:
    """Token ids of ``words`` and the word of each token (``None`` for added special tokens)."""
    ids, owners = [], []
    for index, word in enumerate(words):
        encoding = tokenizer.encode(word, add_special_tokens=False)
        ids += list(encoding.ids)
        owners += [index] * len(encoding.ids)
    return ids, owners


def _align_with_model(args: argparse.Namespace) -> list:
    import torch

    from ..hf.seq2seq import decoder_start, pair_attention
    from ..inspect.compute.word_alignment import attention_alignment, similarity_alignment
    from ._model_options import dtype_line
    from ..workflows.resolve import resolve_model

    pairs = _read_pairs(args.pairs)
    layers = _numbers(args.layers, "--layers") if args.layers else None
    heads = [h - 1 for h in _numbers(args.heads, "--heads")] if args.heads else None
    resolved = resolve_model(args.model, dtype=args.dtype, placement=placement_from_args(args))
    print(dtype_line(resolved))
    model = getattr(resolved.model, "model", resolved.model)
    if not getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(f"--model {args.model} is not an encoder-decoder model; attnlab align reads "
                         f"cross-attention and both sides' hidden states of T5, BART, Marian and the like")
    start = decoder_start(model)
    predicted = []
    for source_words, target_words in pairs:
        source_ids, source_owners = _pieces(resolved.tokenizer, source_words)
        target_ids, target_owners = _pieces(resolved.tokenizer, target_words)
        # the decoder reads [start, target tokens]: position k predicts target token k, position k + 1 reads it
        pair = pair_attention(model, torch.tensor(source_ids), torch.tensor([start] + target_ids),
                              hidden_states=args.method != "attention")
        if args.method == "attention":
            names = list(pair.cross)
            if layers is not None and max(layers) > len(names):
                raise ValueError(f"--layers: the model has {len(names)} cross-attention layers, got {args.layers}")
            chosen = names if layers is None else [names[k - 1] for k in layers]
            rows = slice(0, -1) if args.rows == "predicting" else slice(1, None)
            maps = {name: pair.cross[name][:, rows] for name in chosen}  # [H, T, S]: one row per target token
            links = attention_alignment(maps, heads=heads, target_words=target_owners, source_words=source_owners)
        else:
            depth = len(pair.encoder_hidden) - 1
            layer = depth // 2 if args.hidden_layer is None else args.hidden_layer
            if not 0 <= layer <= depth:
                raise ValueError(f"--hidden-layer must lie in 0..{depth} (0: the embeddings), got {layer}")
            links = similarity_alignment(pair.encoder_hidden[layer], pair.decoder_hidden[layer][1:],
                                         method=args.method, source_words=source_owners,
                                         target_words=target_owners)
        predicted.append(links)
    return predicted


def _align_audio(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .._files import check_output_file, write_json
    from ..checkpoints.encoders.loading import load_tokenizer
    from ..data.audio import read_wav
    from ..hf.audio import audio_features
    from ..workflows.inspect_speech import open_speech_model, speech_pair

    if args.out is None:
        raise ValueError("--audio needs --out WORDS.json (the words' times are written there)")
    check_output_file(args.out, "--out", "the words' times (JSON)")
    samples, rate = read_wav(args.audio, argument="--audio")
    model = open_speech_model(args.model, dtype=args.dtype, placement=placement_from_args(args),
                              otherwise=": align its text with --pairs").model
    try:
        tokenizer = load_tokenizer(args.model)
    except FileNotFoundError:
        raise ValueError(f"{args.model} has no tokenizer.json; attnlab needs it to split the transcript into "
                         f"words") from None
    clip = audio_features(args.model, model, samples, rate)
    clip.features = clip.features.to(next(model.parameters()).dtype)
    speech = speech_pair(model, tokenizer, clip, target=args.target, max_new_tokens=128)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(args.out), {"audio": Path(args.audio).name, "seconds": round(clip.seconds, 3),
                                "transcript": speech.transcript, "words": [w.to_dict() for w in speech.words]})
    print(f"{Path(args.audio).name}: {speech.transcript!r}")
    for word in speech.words:
        print(f"{word.start:7.2f} {word.end:7.2f}  {word.word}")
    print(f"wrote {args.out} ({len(speech.words)} words, seconds)")
    return 0


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .._files import check_output_file
    from ..inspect.compute.word_alignment import alignment_error_rate, format_pharaoh, read_alignments

    if args.audio is not None or args.target is not None:
        if args.audio is None:
            raise ValueError("--target goes with --audio (the transcript of the clip to time)")
        if args.model is None or args.pairs is not None or args.alignments is not None or args.gold is not None:
            raise ValueError("--audio takes --model (a Whisper directory) and --out WORDS.json, without --pairs, "
                             "--alignments or --gold")
        if args.layers or args.heads or args.hidden_layer is not None or args.method != "attention" \
                or args.rows != "predicting":
            raise ValueError("--layers, --heads, --method, --rows and --hidden-layer apply to --pairs; --audio "
                             "uses the model's alignment heads")
        return _align_audio(args)
    if args.model is None and args.alignments is None:
        raise ValueError("give --alignments PRED --gold GOLD to score, or --model DIR --pairs PAIRS --out PRED "
                         "to align")
    if args.model is not None and args.alignments is not None:
        raise ValueError("--alignments scores a file; --model aligns --pairs: give one of them")
    if args.model is None and args.gold is None:
        raise ValueError("--alignments needs --gold GOLD to be scored against")
    if args.model is not None and (args.pairs is None or args.out is None):
        raise ValueError("--model needs --pairs (source ||| target lines) and --out (the Pharaoh file written)")
    if args.model is None and (args.layers or args.heads or args.hidden_layer is not None):
        raise ValueError("--layers, --heads and --hidden-layer apply with --model only")
    if args.rows != "predicting" and (args.model is None or args.method != "attention"):
        raise ValueError("--rows applies to --model with --method attention")
    gold = read_alignments(args.gold, argument="--gold") if args.gold else None
    if args.model is not None:
        check_output_file(args.out, "--out", "the Pharaoh links")
        predicted = _align_with_model(args)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("".join(format_pharaoh(links) + "\n" for links in predicted), encoding="utf-8")
        print(f"wrote {args.out} ({len(predicted)} sentence pairs, {args.method})")
    else:
        predicted = read_alignments(args.alignments, argument="--alignments")
    if gold is not None:
        score = alignment_error_rate(predicted, gold)
        print(json.dumps({key: round(value, 4) if isinstance(value, float) else value
                          for key, value in score.to_dict().items()}))
    return 0
