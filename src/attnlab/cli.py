"""The ``attnlab`` command line.

Each subcommand lives in the package that owns it and exposes two functions:
``add_arguments(parser)`` and ``run(args) -> int``. This file only wires them up,
importing a subcommand's module when that subcommand is used.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn, Optional, Sequence

from ._command_errors import run_reporting_errors

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("attnlab.demo", "run the demonstration job on the embedded data"),
    "train": ("attnlab.train.command", "train a classifier on the embedded data or your CSV/JSONL file"),
    "inspect": ("attnlab.inspect.commands.inspect_command",
                "pictures and an interactive report of one text's attention"),
    "analyze": ("attnlab.inspect.commands.analyze_command",
                "attention statistics over a data set: JSON, plots, HTML summary"),
    "generate": ("attnlab.inspect.commands.generate_command",
                 "continue a prompt with a decoder (GPT-2, Llama family, smollm2); --report shows what each new token attended to"),
    "explain": ("attnlab.inspect.commands.explain_command",
                "per-token scores of one text by attention and gradient attributions, or (--prompt) of what a decoder generates: JSON, PNG, HTML page"),
    "heads": ("attnlab.inspect.commands.heads_command",
              "a decoder's previous-token, duplicate-token, induction and first-token heads; repeated-tokens losses"),
    "compare": ("attnlab.inspect.commands.compare_command",
                "two models' per-head attention statistics side by side, with differences: JSON, page"),
    "align": ("attnlab.inspect.commands.align_command",
              "word alignments (Pharaoh i-j) from an encoder-decoder's cross-attention or hidden states; AER against gold"),
    "image-attention": ("attnlab.inspect.commands.image_attention_command",
                        "draw a digits-text model's text-to-patch attention over the images; score it against the ink"),
    "serve": ("attnlab.serve.command",
              "a live explorer in the browser: maps, statistics, heads switched off or patched, step-by-step generation"),
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: what was wrong and where the help is, no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

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


if __name__ == "__main__":
    sys.exit(main())
