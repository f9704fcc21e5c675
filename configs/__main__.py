"""``streamrl config show --config C [key=value ...]``: the resolved config as YAML, secrets redacted.

``C`` is a preset, a YAML file or a run directory (its saved ``config.yaml``: what that
run ran with). Every default is spelled out, so the output is a complete config file.
"""

from __future__ import annotations

import argparse
import sys

from streamrl.configs.load import config_from_cli, config_text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    top = argparse.ArgumentParser(prog="streamrl config", description=__doc__.splitlines()[0])
    actions = top.add_subparsers(dest="action", metavar="<action>", required=True)
    show = actions.add_parser("show", help="print the resolved config, secrets redacted")
    if not argv or argv[0] != "show":
        # --help, or an error naming the missing or unknown action
        top.parse_args(argv)
    show.prog = "streamrl config show"
    _args, cfg = config_from_cli(show, argv[1:])
    sys.stdout.write(config_text(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
