"""The `harnessrl` command line: one sub-command per stage of the data flow."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence

from harnessrl import __version__
from harnessrl.cli.common import HelpFormatter, Parser
from harnessrl.diskio import DiskFull
from harnessrl.memory import limit_malloc_arenas


def build_parser() -> argparse.ArgumentParser:
    """Returns the top-level parser with every sub-command registered."""
    from harnessrl.cli import design as design_cli
    from harnessrl.cli import eval as eval_cli
    from harnessrl.cli import experiment as experiment_cli
    from harnessrl.cli import external as external_cli
    from harnessrl.cli import pool as pool_cli
    from harnessrl.cli import rollout as rollout_cli
    from harnessrl.cli import serve as serve_cli
    from harnessrl.cli import tasks as tasks_cli
    from harnessrl.cli import train as train_cli

    parser = Parser(
        prog="harnessrl",
        description="Agentic RL through many harnesses (Harness Scaling, Harness-S).",
        formatter_class=HelpFormatter,
        epilog="example:\n  harnessrl rollout --policy oracle --configs S1-T2-O0-C1-W2 --show\n"
        "`harnessrl COMMAND --help` shows each command's options, defaults and an example.",
    )
    parser.add_argument("--version", action="version", version=f"harnessrl {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    design_cli.register(subparsers)
    tasks_cli.register(subparsers)
    rollout_cli.register(subparsers)
    train_cli.register(subparsers)
    serve_cli.register(subparsers)
    external_cli.register(subparsers)
    eval_cli.register(subparsers)
    pool_cli.register(subparsers)
    experiment_cli.register(subparsers)
    return parser


def _terminated(signum: int, _frame: object) -> None:
    """SIGTERM ends the command as an exception would: ``finally`` blocks and finalizers run,
    so a trainer stopped this way leaves no episode workspace behind."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the process exit code."""
    limit_malloc_arenas()  # before any thread allocates: training's memory stays bounded (harnessrl.memory)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    main_thread = threading.current_thread() is threading.main_thread()
    # SIGTERM runs the cleanups (episode workspaces) as an exception would; `serve` sets its own.
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        return int(args.func(args) or 0)
    except DiskFull as exc:  # the folder, the space left and how to go on: not a traceback
        print(f"harnessrl {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as exc:
        # Bad input (a config, a code, a task file): a clear message, not a traceback.
        print(f"harnessrl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
