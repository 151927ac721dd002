"""Held-out accuracy on the digits–statements task: cross-modal attention vs a baseline.

The baseline has the same image and text encoders and head, but fuses by concatenating
the pooled image states with the text's [CLS] state instead of cross-attention.

    flock /tmp/attnlab-bench.lock python benchmarks/learning_digits.py
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F

from attnlab.data.digits_text import collate_digits_text, digits_text_tokenizer, load_digits_text
from attnlab.models.image_text import ImageTextConfig, ImageTextModel, gate_summary


def _batches(tensors: dict, batch_size: int, generator=None):
    count = len(tensors["labels"])
    order = torch.randperm(count, generator=generator) if generator is not None else torch.arange(count)
    for start in range(0, count, batch_size):
        index = order[start : start + batch_size]
        yield {name: value[index] for name, value in tensors.items()}


@torch.no_grad()
def accuracy(model: ImageTextModel, tensors: dict, batch_size: int = 512) -> float:
    model.eval()
    correct = 0
    for batch in _batches(tensors, batch_size):
        logits = model(batch["input_ids"], batch["mask"], images=batch["images"]).logits
        correct += int((logits.argmax(-1) == batch["labels"]).sum())
    return correct / len(tensors["labels"])


def train(config: ImageTextConfig, data: dict, *, epochs: int, batch_size: int, lr: float, seed: int,
          log_every: int = 0) -> tuple[ImageTextModel, float]:
    torch.manual_seed(seed)
    model = ImageTextModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    steps = epochs * math.ceil(len(data["train"]["labels"]) / batch_size)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    )
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    step = 0
    for epoch in range(epochs):
        model.train()
        for batch in _batches(data["train"], batch_size, generator):
            out = model(batch["input_ids"], batch["mask"], images=batch["images"])
            loss = F.cross_entropy(out.logits, batch["labels"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            if log_every and step % log_every == 0:
                gates = " ".join(f"{k}={v:.3f}" for k, v in gate_summary(out.gates).items())
                print(f"  step {step}/{steps} loss {loss.item():.4f} {gates}", flush=True)
        if log_every:
            print(f"  epoch {epoch + 1}: validation {accuracy(model, data['validation']):.4f}", flush=True)
    return model, time.perf_counter() - start


def digits_section(*, epochs: int = 12, batch_size: int = 64, lr: float = 1e-3, seed: int = 0,
                   verbose: bool = True, **config_overrides) -> dict:
    splits = load_digits_text(seed=seed)
    tokenizer = digits_text_tokenizer()
    data = {name: collate_digits_text(examples, tokenizer) for name, examples in splits.items()}
    vocab_size = tokenizer.get_vocab_size()
    results = {}
    for fusion in ("cross_attention", "concat"):
        config = ImageTextConfig(vocab_size=vocab_size, fusion=fusion, **config_overrides)
        model, seconds = train(config, data, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed,
                               log_every=100 if verbose else 0)
        results[fusion] = {
            "test_accuracy": accuracy(model, data["test"]),
            "validation_accuracy": accuracy(model, data["validation"]),
            "train_seconds": seconds,
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        if verbose:
            print(f"{fusion}: {results[fusion]}", flush=True)
    lines = [
        "digits–statements (held-out images): test accuracy",
        f"  cross-modal attention {results['cross_attention']['test_accuracy']:.4f} "
        f"({results['cross_attention']['train_seconds']:.0f} s)",
        f"  concat baseline       {results['concat']['test_accuracy']:.4f} "
        f"({results['concat']['train_seconds']:.0f} s)",
    ]
    print("\n".join(lines))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    digits_section(epochs=args.epochs, seed=args.seed)


if __name__ == "__main__":
    main()
