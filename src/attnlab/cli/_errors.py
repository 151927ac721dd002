"""How every command ends on an error a user can act on: one line on stderr and an exit
code, never a traceback. Shared by ``attnlab SUBCOMMAND`` and ``python -m attnlab.cli.demo``."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Callable

__all__ = ["run_reporting_errors"]


def run_reporting_errors(command: str, run: Callable[[argparse.Namespace], object], args: argparse.Namespace) -> int:
    """``run(args)``'s exit code; an interrupt, bad input or an unusable path is one line."""
    from ..train.interrupts import TrainingInterrupted
    from ..workflows.corpus_pass import AnalysisInterrupted

    try:
        return int(run(args) or 0)
    except AnalysisInterrupted as error:  # a clean stop: the partial statistics are written
        print(f"attnlab {command}: {error}", file=sys.stderr)
        return error.exit_code
    except TrainingInterrupted as error:  # a clean stop: the checkpoint is written
        again = f"; continue with: attnlab {command} --out {shlex.quote(str(args.out))} --resume" if (
            error.checkpoint is not None and hasattr(args, "resume") and hasattr(args, "out")) else ""
        print(f"attnlab {command}: {error}{again}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt as error:  # a second signal during training, or Ctrl-C outside it
        print(f"attnlab {command}: stopped{f' ({error})' if str(error) else ''}", file=sys.stderr)
        return 130
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"attnlab {command}: error: {error}", file=sys.stderr)
        return 2
    except (PermissionError, NotADirectoryError, IsADirectoryError, FileExistsError) as error:
        # a path the user named that cannot be used; commands check their outputs up front,
        # so this is a last line of defence (the path changed while the command ran)
        print(f"attnlab {command}: error: {error}", file=sys.stderr)
        return 2
