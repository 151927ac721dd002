"""Word alignment from cross-attention while a translation model learns: AER falls as it trains.

    python benchmarks/alignment.py [--steps 600] [--every 75] [--lr 3e-3]

The task is synthetic and its gold alignment is known: a string of digits is translated into
number words in reverse order (``3 1 4`` -> ``four one three``), so source word ``i`` of ``n``
is target word ``n - 1 - i``, every link sure. A tiny random BART (built by transformers from
``BartConfig``; nothing is downloaded) is trained by attnlab's :class:`TransformerTrainer`
(teacher forcing, the model's own cross-entropy on ``labels``). At step 0 and every
``--every`` steps the held-out pairs are aligned from the cross-attention, every layer and
head averaged (:func:`attention_alignment`, Pharaoh links), and scored against the gold links
by alignment error rate (:func:`alignment_error_rate`).

Which decoder row stands for target word ``j``: the decoder reads ``[start, w_0, ..., w_n-1]``,
and the row at position ``j`` is the one that *predicts* ``w_j`` (the row at ``j + 1``
*reads* it). Both are scored: ``AER (predicting rows)`` is the usual reading of attention as
alignment (the step that emits the word, ``attnlab align``'s default); ``AER (reading rows)`` is
``attnlab align --rows reading``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional

import torch

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
PAD, START, EOS = 0, 1, 2
DIGIT0, WORD0 = 3, 13  # token ids of "0" and of "zero"
VOCAB = WORD0 + len(WORDS)


def make_pairs(count: int, *, seed: int, min_length: int = 3, max_length: int = 7) -> list[list[int]]:
    """``count`` random digit strings (lists of digits 0-9) of ``min_length..max_length`` digits."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_length, max_length + 1, (count,), generator=generator).tolist()
    return [torch.randint(0, 10, (length,), generator=generator).tolist() for length in lengths]


def source_ids(digits: list[int]) -> list[int]:
    return [DIGIT0 + d for d in digits] + [EOS]


def target_ids(digits: list[int]) -> list[int]:
    return [WORD0 + d for d in reversed(digits)] + [EOS]


def gold_links(digits: list[int]):
    from attnlab.inspect.compute.word_alignment import GoldAlignment

    n = len(digits)
    sure = frozenset((i, n - 1 - i) for i in range(n))
    return GoldAlignment(sure, sure)


def collate(batch: list[list[int]]) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``labels`` (-100 past each target's end)."""
    sources = [source_ids(digits) for digits in batch]
    targets = [target_ids(digits) for digits in batch]
    S, T = max(map(len, sources)), max(map(len, targets))
    input_ids = torch.full((len(batch), S), PAD)  # [B, S]
    labels = torch.full((len(batch), T), -100)  # [B, T]
    for row, (source, target) in enumerate(zip(sources, targets)):
        input_ids[row, :len(source)] = torch.tensor(source)
        labels[row, :len(target)] = torch.tensor(target)
    return {"input_ids": input_ids, "attention_mask": (input_ids != PAD).long(), "labels": labels}


def build_model(*, d_model: int = 64, layers: int = 2, heads: int = 4, seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    config = transformers.BartConfig(
        vocab_size=VOCAB, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model, max_position_embeddings=32, dropout=0.0, attention_dropout=0.0,
        pad_token_id=PAD, bos_token_id=START, eos_token_id=EOS, decoder_start_token_id=START,
        forced_eos_token_id=None,
    )
    return transformers.BartForConditionalGeneration(config)


def alignment_scores(model, pairs: list[list[int]]) -> dict[str, float]:
    """AER of the cross-attention's links (all layers and heads averaged) on ``pairs``, with
    the rows that predict each target word and with the rows that read it."""
    from attnlab.hf.seq2seq import pair_attention
    from attnlab.inspect.compute.word_alignment import alignment_error_rate, attention_alignment

    model.eval()
    predicting, reading, gold = [], [], []
    for digits in pairs:
        n = len(digits)
        # source words are the digits (the final </s> is no word); the decoder reads [start, words, </s>]
        pair = pair_attention(model, torch.tensor(source_ids(digits)), torch.tensor([START] + target_ids(digits)))
        columns = list(range(n)) + [None]
        for rows, found in ((slice(0, n), predicting), (slice(1, n + 1), reading)):
            maps = {name: weights[:, rows] for name, weights in pair.cross.items()}  # [H, n, S]
            found.append(attention_alignment(maps, source_words=columns))
        gold.append(gold_links(digits))
    best = alignment_error_rate(predicting, gold)
    return {"aer": best.aer, "precision": best.precision, "recall": best.recall,
            "aer_reading": alignment_error_rate(reading, gold).aer}


def run(steps: int = 600, every: int = 75, *, learning_rate: float = 3e-3, batch_size: int = 32,
        held_out: int = 200, seed: int = 0) -> list[dict]:
    """Train and score; returns one row per evaluation (``step``, ``loss``, ``aer``, ...)."""
    from attnlab.train.trainer import TransformerTrainer

    if steps < 1 or every < 1:
        raise ValueError(f"--steps and --every must be at least 1, got {steps} and {every}")
    model = build_model(seed=seed)
    trainer = TransformerTrainer(model, learning_rate=learning_rate, warmup_steps=min(50, steps // 10),
                                 total_steps=steps, seed=seed, quiet=True)
    test = make_pairs(held_out, seed=seed + 1)
    generator = torch.Generator().manual_seed(seed)
    rows, loss, started = [], float("nan"), time.perf_counter()
    for step in range(steps + 1):
        if step % every == 0 or step == steps:
            rows.append({"step": step, "loss": loss, **alignment_scores(model, test),
                         "seconds": time.perf_counter() - started})
        if step == steps:
            break
        batch = make_pairs(batch_size, seed=int(torch.randint(0, 2**31 - 1, (), generator=generator)))
        loss = trainer.train_step(collate(batch))
    return rows


def print_table(rows: list[dict]) -> None:
    print("| step | training loss | AER (predicting rows) | precision | recall | AER (reading rows) | seconds |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        loss = "-" if row["loss"] != row["loss"] else f"{row['loss']:.3f}"
        print(f"| {row['step']} | {loss} | {row['aer']:.2f} | {row['precision']:.2f} | {row['recall']:.2f} "
              f"| {row['aer_reading']:.2f} | {row['seconds']:.0f} |")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps (default 600)")
    parser.add_argument("--every", type=int, default=75, help="score the alignment every this many steps")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--held-out", type=int, default=200, help="held-out pairs scored (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("benchmarks/alignment.py builds a tiny BART with transformers: pip install 'attnlab[hf]'",
              file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    print(f"digits -> reversed number words, 3-7 digits; tiny BART (2+2 layers, width 64, 4 heads), "
          f"lr {args.lr:g}, batch {args.batch_size}, {args.held_out} held-out pairs, {threads} threads")
    rows = run(args.steps, args.every, learning_rate=args.lr, batch_size=args.batch_size,
               held_out=args.held_out, seed=args.seed)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
