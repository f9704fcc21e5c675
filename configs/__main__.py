"""``streamrl config show|convert``: print a resolved config; translate a TRL or verl one.

``show --config C [key=value ...]``: the resolved config as YAML, secrets redacted. ``C`` is
a preset, a YAML file or a run directory (its saved ``config.yaml``: what that run ran
with). Every default is spelled out, so the output is a complete config file.

``convert --from trl|trl-sft|trl-dpo|verl FILE [--base C] [--out OUT]``: FILE (a TRL
``GRPOConfig``, ``SFTConfig`` or ``DPOConfig``, or a verl config, as YAML) as a streamrl
``run``, ``sft`` or ``dpo`` config, on top of ``C``'s file when given, plus a table of each field: a code reference (code a run would import: written commented out, for the
user to review), mapped, approximated (and how), refused (and why) or unset. Every YAML file
is read through ``yamlfile``'s bounds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamrl.configs import convert, yamlfile
from streamrl.configs.errors import ConfigError
from streamrl.configs.load import config_from_cli, config_text
from streamrl.configs.runfiles import write_new


def _convert(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="streamrl config convert", description="a TRL or verl config as a streamrl config"
    )
    parser.add_argument(
        "--from",
        dest="dialect",
        choices=list(convert.RULES),
        required=True,
        help="trl: a GRPOConfig, for streamrl run; trl-sft: an SFTConfig, for streamrl sft; "
        "trl-dpo: a DPOConfig, for streamrl dpo; verl: a ppo_trainer.yaml, for streamrl run. A "
        "TRL file with a field of another class stops, naming the --from to use",
    )
    parser.add_argument("file", help="the TRL or verl config, as YAML")
    parser.add_argument("--base", help="a preset or YAML file the converted settings go on top of")
    parser.add_argument("--out", help="write the YAML here (default: stdout; the table to stderr)")
    args = parser.parse_args(argv)
    try:
        tree = yamlfile.parse_mapping(yamlfile.read_text(Path(args.file), args.file), args.file)
        settings, rows = convert.convert(tree, args.dialect, args.base)
        text = convert.yaml_text(settings, rows, args.base, args.file, args.dialect)
    except ConfigError as exc:
        print(f"streamrl config convert: {exc}", file=sys.stderr)
        return 2
    report = convert.table(rows)
    if args.out:
        try:
            # a link planted at the name is replaced, not written through
            write_new(args.out, text)
        except OSError as exc:
            print(f"streamrl config convert: --out {args.out}: {exc.strerror}", file=sys.stderr)
            return 2
        print(f"{report}\n\nwrote {args.out}")
    else:
        sys.stdout.write(text)
        print(report, file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    top = argparse.ArgumentParser(prog="streamrl config", description=__doc__.splitlines()[0])
    actions = top.add_subparsers(dest="action", metavar="<action>", required=True)
    show = actions.add_parser("show", help="print the resolved config, secrets redacted")
    actions.add_parser("convert", help="a TRL or verl config as a streamrl one", add_help=False)
    if not argv or argv[0] not in ("show", "convert"):
        # --help, or an error naming the missing or unknown action
        top.parse_args(argv)
    if argv[0] == "convert":
        return _convert(argv[1:])
    show.prog = "streamrl config show"
    _args, cfg = config_from_cli(show, argv[1:])
    sys.stdout.write(config_text(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
