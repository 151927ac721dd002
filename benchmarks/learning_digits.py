"""Held-out accuracy on the digits–statements task: cross-modal attention vs a baseline.

The baseline has the same image and text encoders and head, but fuses by concatenating
the pooled image states with the text's [CLS] state instead of cross-attention. Both
train with the same data, seed, schedule and number of steps; the test images are
never seen in training.

    flock /tmp/attnlab-bench.lock python benchmarks/learning_digits.py
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

from attnlab.data.digits_text import digits_text_tokenizer, load_digits_text
from attnlab.models.image_text import ImageTextConfig, ImageTextModel, gate_summary

STATEMENTS_PER_IMAGE = 8


def _group_by_image(examples, tokenizer, per_image: int) -> dict[str, torch.Tensor]:
    """``input_ids/mask [N, K, T]``, ``labels [N, K]``, ``images [N, 8, 8]`` for N images."""
    encodings = tokenizer.encode_batch([example.text for example in examples])
    T = max(len(encoding.ids) for encoding in encodings)
    input_ids = torch.zeros(len(examples), T, dtype=torch.long)
    for row, encoding in enumerate(encodings):
        input_ids[row, : len(encoding.ids)] = torch.tensor(encoding.ids)
    N = len(examples) // per_image
    images = torch.stack([torch.from_numpy(examples[i * per_image].image) for i in range(N)])
    input_ids = input_ids.view(N, per_image, T)  # [N, K, T]
    return {
        "input_ids": input_ids,
        "mask": input_ids != 0,
        "labels": torch.tensor([example.label for example in examples]).view(N, per_image),
        "images": images,
    }


def _batches(data: dict, images_per_batch: int, generator: Optional[torch.Generator] = None) -> Iterator[dict]:
    N, K = data["labels"].shape
    order = torch.randperm(N, generator=generator) if generator is not None else torch.arange(N)
    for start in range(0, N, images_per_batch):
        index = order[start : start + images_per_batch]
        yield {
            "input_ids": data["input_ids"][index].flatten(0, 1),  # [n * K, T]
            "mask": data["mask"][index].flatten(0, 1),
            "images": data["images"][index],  # [n, 8, 8]
            "image_index": torch.arange(len(index)).repeat_interleave(K),  # [n * K]
            "labels": data["labels"][index].flatten(),
        }


def _forward(model: ImageTextModel, batch: dict):
    return model(batch["input_ids"], batch["mask"], images=batch["images"], image_index=batch["image_index"])


@torch.no_grad()
def accuracy(model: ImageTextModel, data: dict) -> float:
    model.eval()
    correct = total = 0
    for batch in _batches(data, 256):
        correct += int((_forward(model, batch).logits.argmax(-1) == batch["labels"]).sum())
        total += len(batch["labels"])
    return correct / total


def train(config: ImageTextConfig, data: dict, *, epochs: int, images_per_batch: int, lr: float, seed: int,
          log_every: int = 0) -> tuple[ImageTextModel, float]:
    """Train from scratch with AdamW and warm-up + cosine; returns the model and seconds."""
    torch.manual_seed(seed)
    model = ImageTextModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    steps = epochs * math.ceil(len(data["train"]["labels"]) / images_per_batch)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(1.0, step / steps))))
    )
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    step = 0
    for epoch in range(epochs):
        model.train()
        for batch in _batches(data["train"], images_per_batch, generator):
            out = _forward(model, batch)
            loss = F.cross_entropy(out.logits, batch["labels"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            if log_every and step % log_every == 0:
                gates = " ".join(f"{name}={value:.3f}" for name, value in gate_summary(out.gates).items())
                print(f"  step {step}/{steps} loss {loss.item():.4f} {gates}", flush=True)
        if log_every:
            seconds = time.perf_counter() - start
            print(f"  epoch {epoch + 1}: validation {accuracy(model, data['validation']):.4f} ({seconds:.0f} s)",
                  flush=True)
            model.train()
    return model, time.perf_counter() - start


def load_data(seed: int = 0, per_image: int = STATEMENTS_PER_IMAGE) -> tuple[dict, int]:
    """The task grouped by image, and the vocabulary size."""
    splits = load_digits_text(seed=seed, statements_per_image=per_image)
    tokenizer = digits_text_tokenizer()
    data = {name: _group_by_image(examples, tokenizer, per_image) for name, examples in splits.items()}
    return data, tokenizer.get_vocab_size()


def digits_section(*, epochs: int = 12, images_per_batch: int = 16, lr: float = 2e-3, seed: int = 0,
                   verbose: bool = True, **config_overrides) -> dict:
    """Train the cross-modal model and the concat baseline; return and print held-out accuracy."""
    data, vocab_size = load_data(seed)
    results = {}
    for fusion in ("cross_attention", "concat"):
        config = ImageTextConfig(vocab_size=vocab_size, fusion=fusion, **config_overrides)
        model, seconds = train(config, data, epochs=epochs, images_per_batch=images_per_batch, lr=lr, seed=seed,
                               log_every=100 if verbose else 0)
        results[fusion] = {
            "test_accuracy": accuracy(model, data["test"]),
            "validation_accuracy": accuracy(model, data["validation"]),
            "train_seconds": seconds,
            "parameters": sum(p.numel() for p in model.parameters()),
        }
    cross, concat = results["cross_attention"], results["concat"]
    print("digits–statements task, held-out images "
          f"({len(data['test']['labels'])} images x {STATEMENTS_PER_IMAGE} statements): test accuracy")
    print(f"  cross-modal attention  {cross['test_accuracy']:.4f}  ({cross['train_seconds']:.0f} s training)")
    print(f"  concat baseline        {concat['test_accuracy']:.4f}  ({concat['train_seconds']:.0f} s training)")
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
