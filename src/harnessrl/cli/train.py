"""`harnessrl train`: run or resume a harness-scaling training run."""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from harnessrl.cli.common import command
from harnessrl.rl.config import PRESETS, TrainConfig, load_config, parse_set_overrides


def register(subparsers: Any) -> None:
    """Adds the `train` sub-command."""
    p = command(subparsers, "train", example="harnessrl train --preset quick --set learning_rate=1e-5 --print-config",
        help="train a policy through many harnesses (GRPO over the orthogonal design)",
        description="With no arguments: the `quick` preset with the embedded model on CPU; it writes "
        "metrics, checkpoints and a summary of base vs trained Pass@1 to the run directory.",
    )
    p.add_argument("--config", default=None, help="YAML file of TrainConfig fields (may name a preset)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="start from a preset")
    p.add_argument("--run-dir", default=None, help="run directory (default: runs/<preset>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its last complete checkpoint (the folder must exist)")
    p.add_argument("--steps", type=int, default=None, help="override the number of steps")
    p.add_argument("--model", default=None, help="override the model (embedded or a local folder)")
    p.add_argument("--seed", type=int, default=None, help="override the seed")
    p.add_argument("--device", default=None, help="override the device")
    p.add_argument("--policy-server", default=None, metavar="URL",
                   help="roll out through this vLLM server (http://host:port/v1), weights synced every step")
    p.add_argument(
        "--set", "-o", dest="set", action="append", default=[], metavar="FIELD=VALUE",
        help="override any config field (repeatable); VALUE is YAML, e.g. --set learning_rate=1e-5 "
        "--set tiers=[1,2] --set families=null; applied after --preset/--config, before the "
        "flags above; --print-config lists the fields",
    )
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config as YAML, each field under its description, and exit "
                   "(the output is a valid --config file)")
    p.add_argument("--config-reference", action="store_true",
                   help="print the Markdown reference of every config field (docs/config.md) and exit")
    p.add_argument(
        "--nproc", type=int, default=None, metavar="N",
        help="data-parallel training on N local processes: relaunches this command under torchrun "
        "(the same as `torchrun --nproc-per-node N -m harnessrl.cli train ...`)",
    )
    p.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    if args.config_reference:
        print(config_reference(), end="")
        return 0
    sets = getattr(args, "set", None) or []
    # --set run_dir=DIR names the run directory as --run-dir does (the flag wins over it).
    run_dir = args.run_dir or parse_set_overrides(sets).get("run_dir")
    if args.resume and not run_dir:
        raise ValueError("--resume needs --run-dir naming the run to continue")
    if args.resume and not Path(run_dir).is_dir():
        raise ValueError(
            f"--resume: run directory {run_dir} does not exist, so there is nothing to resume "
            "(check the path, or leave out --resume to start a new run there)"
        )
    if not run_dir and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("under torchrun, pass --run-dir: every rank must name the same run directory")
    run_dir = run_dir or f"runs/{args.preset or 'quick'}-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = load_config(
        args.config, args.preset,
        {"run_dir": run_dir, "steps": args.steps, "model": args.model, "seed": args.seed, "device": args.device,
         "policy_server": getattr(args, "policy_server", None)},
        sets=sets,
    )
    if args.print_config:
        print(describe_config(cfg), end="")
        return 0
    if args.nproc is not None and args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        from harnessrl.rl.distributed import launch

        argv = sys.argv[sys.argv.index("train") + 1 :]
        return launch(args.nproc, argv if args.run_dir else [*argv, "--run-dir", cfg.run_dir])
    from harnessrl.rl.loop import train

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    if os.environ.get("RANK", "0") == "0":
        log(f"run directory: {cfg.run_dir}")
    summary = train(cfg, resume=args.resume, log=log)
    if os.environ.get("RANK", "0") != "0":
        return 0  # rank 0 prints the summary of a torchrun job
    print()
    from harnessrl.rl.summary import format_summary

    print(format_summary(summary))
    sys.stdout.flush()
    return 0


def _yaml_line(name: str, value: Any) -> str:
    return yaml.safe_dump({name: value}, default_flow_style=True, sort_keys=False, width=10**6)[1:-2] + "\n"


def describe_config(cfg: TrainConfig) -> str:
    """Returns ``cfg`` as YAML with each field's description as a comment above it (loadable
    as a ``--config`` file)."""
    lines = []
    for name, info in TrainConfig.model_fields.items():
        lines.append(f"# {info.description}\n" if info.description else "")
        lines.append(_yaml_line(name, getattr(cfg, name)))
    return "".join(lines)


def config_sections() -> dict[str, str]:
    """Returns each field's section: the ``# -- section --`` comment above it in ``TrainConfig``."""
    sections, current = {}, ""
    for line in inspect.getsource(TrainConfig).splitlines():
        header = re.match(r"\s*# -- (.+?) -+\s*$", line)
        field = re.match(r"\s{4}(\w+):", line)
        if header:
            current = header.group(1)
        elif field and field.group(1) in TrainConfig.model_fields:
            sections[field.group(1)] = current
    return sections


def config_reference() -> str:
    """Returns docs/config.md: every ``TrainConfig`` field with its type, default and
    description, by section, generated from the fields (``harnessrl train --config-reference``)."""
    out = [
        "# Training configuration reference",
        "",
        "Generated from the fields of `harnessrl.rl.config.TrainConfig` by "
        "`harnessrl train --config-reference > docs/config.md` (a test checks that this page is current).",
        "Set a field in a `--config` YAML file or with `--set FIELD=VALUE` (VALUE is YAML); "
        f"presets: {', '.join(sorted(PRESETS))}; `--print-config` prints the merged config with these descriptions.",
    ]
    defaults = TrainConfig()
    section = None
    sections = config_sections()
    for name, info in TrainConfig.model_fields.items():
        if sections.get(name, "") != section:
            section = sections.get(name, "")
            out += ["", f"## {section or 'other'}", "", "| field | type | default | description |", "|---|---|---|---|"]
        kind = str(info.annotation).replace("typing.", "").replace("<class '", "").replace("'>", "").replace("|", "\\|")
        default = _yaml_line(name, getattr(defaults, name)).split(": ", 1)[1].strip()
        description = (info.description or "").replace("|", "\\|")
        out.append(f"| `{name}` | `{kind}` | `{default}` | {description} |")
    return "\n".join(out) + "\n"
