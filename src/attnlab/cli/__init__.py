"""The ``attnlab`` command line (also ``python -m attnlab.cli``).

Each subcommand is one module of this package, ``attnlab.cli.<name>``, with two functions:
``add_arguments(parser)`` and ``run(args) -> int``. They parse and check the arguments, call
the library (:mod:`attnlab.workflows`, :mod:`attnlab.train`, :mod:`attnlab.serve`) and print
what came back; nothing below this package imports it. This file only wires them up,
importing a subcommand's module when that subcommand is used.
"""

from __future__ import annotations

import argparse
import importlib
from typing import NoReturn, Optional, Sequence

from ._errors import run_reporting_errors

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("attnlab.cli.demo", "run the demonstration job on the embedded data"),
    "train": ("attnlab.cli.train", "train a classifier on the embedded data or your CSV/JSONL file"),
    "inspect": ("attnlab.cli.inspect",
                "pictures and an interactive report of one text's attention"),
    "analyze": ("attnlab.cli.analyze",
                "attention statistics over a data set: JSON, plots, HTML summary"),
    "generate": ("attnlab.cli.generate",
                 "continue a prompt with a decoder (GPT-2, Llama family, smollm2); --report shows what each new token attended to"),
    "explain": ("attnlab.cli.explain",
                "per-token scores of one text by attention and gradient attributions, or (--prompt) of what a decoder generates: JSON, PNG, HTML page"),
    "heads": ("attnlab.cli.heads",
              "a decoder's previous-token, duplicate-token, induction and first-token heads; repeated-tokens losses"),
    "compare": ("attnlab.cli.compare",
                "two models' per-head attention statistics side by side, with differences: JSON, page"),
    "align": ("attnlab.cli.align",
              "word alignments (Pharaoh i-j) from an encoder-decoder's cross-attention or hidden states; AER against gold"),
    "image-attention": ("attnlab.cli.image_attention",
                        "draw a digits-text model's text-to-patch attention over the images; score it against the ink"),
    "serve": ("attnlab.cli.serve",
              "a live explorer in the browser: maps, statistics, heads switched off or patched, step-by-step generation"),
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: what was wrong and where the help is, no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _Parser(prog="attnlab", description="Build, train and look inside Transformer attention.")
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        sub_parser.set_defaults(_module=module_name)
        importlib.import_module(module_name).add_arguments(sub_parser)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    module = importlib.import_module(args._module)
    return run_reporting_errors(args.command, module.run, args)
