"""Which baseline should integrated gradients start from? Steps to completeness and faithfulness, per baseline.

For each baseline of :mod:`attnlab.inspect.compute.integrated_gradients_baseline` (``pad``: the
pad or neutral token's embedding; ``zero``: the zero vector; ``mean``: the mean embedding) and
each text, integrated gradients runs as ``attnlab explain`` runs it (50 points, doubled up to
400 until the completeness gap is at most 5 %), and the table gives:

* points: the median of the points it ended with, and how many texts were still over 5 % at 400
  (``--points`` tries others: a slow machine can afford fewer on a 135M decoder);
* gap@50: the mean completeness gap at 50 points (``|sum of scores - (f(x) - f(x'))| / |f(x) - f(x')|``);
* deletion AOPC: the mean over k = 0, 10, ..., 100 % of ``f(x) - f(x without its top k % tokens)``
  (Samek et al. 2017; higher: more faithful), tokens deleted as in ``benchmarks/faithfulness.py``;
  ``random`` ranks the tokens at random (the reference a method should beat).

``f`` is the classifier's probability of its predicted class (a from-scratch model with the
demo's architecture, trained here into ``OUT/demo-run`` or reused; ``--classifier DIR`` for
another) and, for the decoder (``--decoder``, default ``smollm2``), the log-probability of its
own next token after a prompt (the first ``--prompt-tokens`` tokens of a text). Texts: the
embedded Rotten Tomatoes test split. ``--quick`` runs tiny random models on three texts (a
smoke test: its figures mean nothing)::

    python benchmarks/ig_baselines.py --texts 20 --out ig-baselines/
    python benchmarks/ig_baselines.py --quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # faithfulness.py, when imported by a test

from _faithfulness_measures import STEPS, Quantity, curve_inputs  # noqa: E402
from faithfulness import SPECIAL, train_demo_model  # noqa: E402

from attnlab._files import write_json  # noqa: E402
from attnlab.data import load_rotten_tomatoes  # noqa: E402
from attnlab.inspect.compute.generation_attribution import attribute_generation  # noqa: E402
from attnlab.inspect.compute.integrated_gradients_baseline import BASELINES  # noqa: E402
from attnlab.inspect.compute.integrated_gradients_steps import (AUTO_STEPS, COMPLETENESS_TOLERANCE, IG,  # noqa: E402
                                                                completeness_gap)
from attnlab.inspect.compute.token_attribution import attribute_tokens  # noqa: E402
from attnlab.workflows.explain_generation import neutral_token_id  # noqa: E402
from attnlab.workflows.explain_text import baseline_for  # noqa: E402
from attnlab.workflows.inspect_text import encode_text  # noqa: E402
from attnlab._machine import cpu_name  # noqa: E402


def _deletion_inputs(ids: list[int], words: list[int], order: list[int]) -> list[list[int]]:
    """``ids`` without the top k % of ``order`` for k = 10 .. 100 (``ceil(k n / 100)`` tokens)."""
    return curve_inputs(ids, words, order)[0]


def _until_complete(run: Callable[[int], tuple[np.ndarray, float]], tried: Sequence[int]
                    ) -> tuple[np.ndarray, int, float, float]:
    """``(scores, points, first gap, last gap)``: ``tried`` points in turn until the gap is at most 5 %."""
    first_gap = None
    for points in tried:
        scores, gap = run(points)
        first_gap = gap if first_gap is None else first_gap
        if gap <= COMPLETENESS_TOLERANCE:
            break
    return scores, points, first_gap, gap


class _Tally:
    def __init__(self) -> None:
        self.points: list[int] = []
        self.over: int = 0
        self.gaps: list[float] = []
        self.curves: list[np.ndarray] = []
        self.seconds = 0.0

    def summary(self) -> dict[str, Any]:
        curve = np.mean(self.curves, axis=0) if self.curves else np.zeros(len(STEPS))
        return {"median_points": statistics.median(self.points) if self.points else None,
                "over_tolerance_at_400": self.over, "mean_gap_at_50": float(np.mean(self.gaps)) if self.gaps else None,
                "deletion_aopc": float(curve.mean()), "deletion_curve": curve.tolist(),
                "seconds_per_text": self.seconds / max(len(self.curves), 1)}


def evaluate_classifier(model, tokenizer, texts: Sequence[str], *, max_length: int, seed: int,
                        tried: Sequence[int] = AUTO_STEPS) -> dict[str, Any]:
    """Per baseline (and random): steps to completeness and deletion AOPC of ``p(predicted class)``."""
    pad_id = getattr(model.encoder.config, "pad_id", None) or 0
    tallies = {name: _Tally() for name in (*BASELINES, "random")}
    rng = np.random.default_rng(seed)
    for text in texts:
        input_ids, tokens = encode_text(tokenizer, text, max_length)
        ids = input_ids[0].tolist()
        words = [i for i, token in enumerate(tokens) if token not in SPECIAL]
        if len(words) < 2:
            continue
        reference = baseline_for(input_ids, tokenizer, pad_id)
        with torch.no_grad():
            label = int(model(input_ids).logits[0].argmax())
        quantity = Quantity(model, label, decoder=False, pad_id=pad_id, batch=64)

        def run(name: str, points: int) -> tuple[np.ndarray, float]:
            found = attribute_tokens(model, input_ids, [IG], target=label, baseline_ids=reference,
                                     baseline=name, steps=points)
            return found.scores[IG][0].numpy(), completeness_gap(found.scores[IG], found.delta)

        _measure_text(tallies, run, quantity, ids, words, rng, tried)
    return {name: tally.summary() for name, tally in tallies.items()}


def evaluate_decoder(model, tokenizer, texts: Sequence[str], *, prompt_tokens: int, seed: int,
                     tried: Sequence[int] = AUTO_STEPS) -> dict[str, Any]:
    """Per baseline (and random): steps to completeness and deletion AOPC of ``log p(next token)``."""
    neutral = neutral_token_id(model)
    tallies = {name: _Tally() for name in (*BASELINES, "random")}
    rng = np.random.default_rng(seed)
    for text in texts:
        ids = tokenizer.encode(text).ids[:prompt_tokens]
        if len(ids) < 2:
            continue
        with torch.no_grad():
            target = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        sequence, words = torch.tensor([ids + [target]]), list(range(len(ids)))
        quantity = Quantity(model, target, decoder=True, pad_id=neutral, batch=16, empty_id=neutral)

        def run(name: str, points: int) -> tuple[np.ndarray, float]:
            found = attribute_generation(model, sequence, len(ids), [IG], neutral_id=neutral, baseline=name,
                                         steps=points)
            return found.scores[IG][0, : len(ids)].numpy(), completeness_gap(found.scores[IG], found.delta)

        _measure_text(tallies, run, quantity, ids, words, rng, tried)
    return {name: tally.summary() for name, tally in tallies.items()}


def _measure_text(tallies: dict, run: Callable[[str, int], tuple[np.ndarray, float]], quantity: Quantity,
                  ids: list[int], words: list[int], rng: np.random.Generator, tried: Sequence[int]) -> None:
    """One text: each baseline's integrated gradients until complete (``run(baseline, points)``),
    then the deletion curve of its ranking and of a random one, into ``tallies``."""
    full = quantity.of_ids([ids])[0]
    orders = {}
    for name in BASELINES:
        started = time.perf_counter()
        scores, points, first_gap, last_gap = _until_complete(lambda points: run(name, points), tried)
        _count(tallies[name], points, first_gap, last_gap, time.perf_counter() - started)
        orders[name] = sorted(words, key=lambda i: -scores[i])
    orders["random"] = list(rng.permutation(words))
    for name, order in orders.items():
        values = quantity.of_ids(_deletion_inputs(ids, words, order))
        tallies[name].curves.append(np.concatenate([[0.0], full - values]))


def _count(tally: _Tally, points: int, first_gap: float, last_gap: float, seconds: float) -> None:
    tally.points.append(points)
    tally.gaps.append(first_gap)
    tally.over += int(last_gap > COMPLETENESS_TOLERANCE)
    tally.seconds += seconds


def table(results: dict[str, Any], measure: str, tried: Sequence[int] = AUTO_STEPS) -> str:
    """A Markdown table, baselines first, random last."""
    lines = [f"| baseline | median points | texts over 5 % at {tried[-1]} | mean gap at {tried[0]} "
             f"| deletion AOPC ({measure}) "
             "| s/text |", "|---|---|---|---|---|---|"]
    for name, row in results.items():
        if name == "random":
            lines.append(f"| random ranking | | | | {row['deletion_aopc']:.3f} | |")
            continue
        lines.append(f"| {name} | {row['median_points']:g} | {row['over_tolerance_at_400']} | "
                     f"{row['mean_gap_at_50']:.2%} | {row['deletion_aopc']:.3f} | {row['seconds_per_text']:.2f} |")
    return "\n".join(lines)


def _quick_models() -> tuple[Any, Any, Any, Any]:
    """A tiny random classifier and decoder with word-level tokenizers (for the smoke test)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from attnlab import TransformerEncoder
    from attnlab.data import Tokenizer as Wrapped
    from attnlab.models.classifier import EncoderClassifier
    from attnlab.layers.decoder_config import DecoderConfig
    from attnlab.models.decoder import DecoderForCausalLM

    words = "the a film is not good bad very funny dull".split()
    inner = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3,
                                        **{w: i + 4 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = Wrapped(inner)
    torch.manual_seed(0)
    encoder = TransformerEncoder(len(words) + 4, d_model=16, num_layers=1, num_heads=2, d_ff=32, pad_id=0)
    classifier = EncoderClassifier(encoder, 2).eval()
    decoder = DecoderForCausalLM(DecoderConfig(vocab_size=len(words) + 4, d_model=16, num_layers=1, num_heads=2,
                                               num_kv_heads=1, d_ff=32, max_len=32, pad_id=0)).eval()
    return classifier, tokenizer, decoder, tokenizer


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=20, help="the first N texts of the test split")
    parser.add_argument("--classifier", default="demo",
                        help="classifier directory, 'demo' (trained into OUT/demo-run when not there) or 'none'")
    parser.add_argument("--decoder", default="smollm2", help="decoder spec (smollm2, a .gguf, a directory) or 'none'")
    parser.add_argument("--prompt-tokens", type=int, default=12, help="tokens kept per prompt (decoder)")
    parser.add_argument("--max-length", type=int, default=48, help="tokens kept per text (classifier)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the demo classifier, when trained here")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0, help="the random ranking's seed")
    parser.add_argument("--out", type=Path, default=Path("ig-baselines"), help="output directory")
    parser.add_argument("--points", type=int, nargs="+", default=list(AUTO_STEPS),
                        help=f"quadrature points tried in turn until the gap is at most 5 %% (default "
                             f"{' '.join(map(str, AUTO_STEPS))}, as explain; fewer on a slow machine)")
    parser.add_argument("--quick", action="store_true", help="tiny random models, three texts (a smoke test)")
    args = parser.parse_args(argv)
    if args.texts < 1 or min(args.points) < 1:
        parser.error("--texts and --points must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"cpu: {cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads "
          f"(timings are rough on a shared machine)")
    texts = [text for text, _ in load_rotten_tomatoes(seed=0)["test"]][: 3 if args.quick else args.texts]
    runs = []
    if args.quick:
        texts = ["the film is very funny", "a dull film , not good", "bad bad film"]
        classifier, tokenizer, decoder, decoder_tokenizer = _quick_models()
        runs = [("tiny classifier", "classifier", classifier, tokenizer),
                ("tiny decoder", "decoder", decoder, decoder_tokenizer)]
    else:
        import attnlab

        if args.decoder != "none":
            model, tokenizer, _ = attnlab.load(args.decoder)
            runs.append((args.decoder, "decoder", model.eval(), tokenizer))
        if args.classifier != "none":
            args.out.mkdir(parents=True, exist_ok=True)
            spec = str(train_demo_model(args.out, args.epochs)) if args.classifier == "demo" else args.classifier
            model, tokenizer, _ = attnlab.load(spec)
            runs.append((spec, "classifier", model.eval(), tokenizer))
    results = {}
    for name, kind, model, tokenizer in runs:
        started = time.perf_counter()
        if kind == "decoder":
            found = evaluate_decoder(model, tokenizer, texts, prompt_tokens=args.prompt_tokens, seed=args.seed,
                                     tried=args.points)
            measure = "log p(next token), nats"
        else:
            found = evaluate_classifier(model, tokenizer, texts, max_length=args.max_length, seed=args.seed,
                                        tried=args.points)
            measure = "p(class)"
        results[name] = {"kind": kind, "measure": measure, "baselines": found}
        print(f"\n{name} ({kind}): {len(texts)} texts, {time.perf_counter() - started:.0f} s")
        print(table(found, measure, args.points))
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        settings = {"texts": args.texts, "prompt_tokens": args.prompt_tokens, "max_length": args.max_length,
                    "points": args.points, "seed": args.seed, "cpu": cpu_name(),
                    "torch_threads": torch.get_num_threads()}
        write_json(args.out / "ig_baselines.json", {"settings": settings, "models": results})
        print(f"\nwrote {args.out / 'ig_baselines.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
