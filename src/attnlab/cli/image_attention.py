"""Where a trained image–text model looks: text-token -> patch attention on the digits task.

``attnlab image-attention --run DIR --out PICTURES`` draws, for a few held-out
examples, every cross-modal layer's text -> patch attention over the image (per head
and averaged), and writes ``alignment.json`` and ``report.html`` (the inspection
summary page with the pictures inlined): per layer and head, the attention mass that
the statement's tokens put on inked patches over the whole test split, beside uniform
attention's share.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .._files import nonempty_path
# ALIGNMENT_DESCRIPTIONS too: this module's old path (attnlab.inspect.commands.image_attention_command) held it
from ..workflows.image_attention import ALIGNMENT_DESCRIPTIONS, draw_examples, write_html_summary  # noqa: F401

__all__ = ["MAX_EXAMPLES", "add_arguments", "run"]

MAX_EXAMPLES = 100  # pictures per cross-modal layer; each is a grid of tokens x heads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", type=Path, required=True, help="a digits-text run (or checkpoint) directory")
    parser.add_argument("--out", type=nonempty_path, default=Path("image_attention"), help="where PNGs and alignment.json go")
    parser.add_argument("--examples", type=int, default=6,
                        help=f"held-out examples to draw (1..{MAX_EXAMPLES}; one PNG each per layer)")
    parser.add_argument("--split-seed", type=int, default=None, help="the run's data.split_seed (default: from the run)")


def run(args: argparse.Namespace) -> int:
    from .._files import check_output_dir, read_json, write_json
    from ..checkpoints import load_model
    from ..data.digits_text import load_digits_text
    from ..inspect.compute.image_alignment import cross_attention_alignment

    if not 1 <= args.examples <= MAX_EXAMPLES:
        raise ValueError(f"--examples must lie in 1..{MAX_EXAMPLES} (held-out examples drawn, one PNG each per "
                         f"layer), got {args.examples}")
    check_output_dir(args.out, "--out", "the pictures and alignment.json")
    loaded = load_model(args.run)
    if loaded.config.get("model_type") != "image_text":
        raise ValueError(f"{args.run} holds a {loaded.config.get('model_type')!r} model, not an image_text one")
    run_config = args.run / "config.json"
    settings = read_json(run_config) if run_config.is_file() else {}
    data = settings.get("data", {})
    seed = args.split_seed if args.split_seed is not None else data.get("split_seed", 0)
    validation, test = data.get("validation_fraction", 0.1), data.get("test_fraction", 0.2)
    per_image = settings.get("image", {}).get("statements_per_image", 8)
    test_examples = load_digits_text(seed=seed, statements_per_image=per_image,
                                     fractions=(1 - validation - test, validation, test))["test"]
    model, tokenizer = loaded.model, loaded.tokenizer
    alignment = cross_attention_alignment(model, tokenizer, test_examples)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "alignment.json", alignment)
    step = max(1, len(test_examples) // max(args.examples, 1))
    chosen = test_examples[::step][: args.examples]
    paths = []
    for layer in alignment:
        paths += draw_examples(model, tokenizer, chosen, args.out, layer=layer)
    captions = {f"{path.stem}: " + chosen[index % len(chosen)].text: path for index, path in enumerate(paths)}
    report = write_html_summary(args.out / "report.html", alignment, captions,
                                meta={"model": str(args.run), "examples": f"{len(test_examples)} held-out statements"})
    for layer, score in alignment.items():
        print(f"{layer}: attention mass on inked patches {score['mass']:.3f} "
              f"(uniform {score['chance']:.3f}, lift {score['lift']:.2f}; most attended patch inked "
              f"{score['argmax']:.3f})")
    print(f"wrote {len(paths)} PNGs, alignment.json and {report.name} to {args.out}")
    return 0
