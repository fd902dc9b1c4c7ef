"""The ``ebound`` parser, one sub-command per command module, and the entry point."""

import os
import sys

from ._core import Parser
from ._demo import add_demo_parser
from ._estimate import add_estimate_parser
from ._experiments import add_experiment_parsers
from ._heads import add_heads_parser

__all__ = ["build_parser", "main"]


def build_parser():
    """The ``ebound`` argument parser; each command sets ``run``, its function of the args."""
    parser = Parser(
        prog="ebound",
        description="The Entropic Bound: the smallest rank a model needs to solve a task.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_demo_parser(commands)
    add_estimate_parser(commands)
    add_experiment_parsers(commands)
    add_heads_parser(commands)
    return parser


def main(argv=None):
    """Entry point of ``ebound``; returns the exit code.

    Parameters
    ----------
    argv : list of str, default=None
        The arguments; ``None`` reads ``sys.argv[1:]``.

    Returns
    -------
    code : int
        0 on success, 1 when ``demo`` finds ranks that disagree, 2 on a user error (printed
        as one line on stderr), 130 when interrupted, 1 when the output's reader closed the
        pipe.
    """
    args = build_parser().parse_args(argv)
    try:
        code = args.run(args)
        sys.stdout.flush()  # inside the try: a closed pipe is reported here, not at exit
        return code
    except (ValueError, TypeError) as exc:  # CLIError is a ValueError
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"ebound: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ebound: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of the output left (`ebound ... | head`): no traceback for that.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
