"""``streamrl learner``: the learner as a command on a host of its own (one node of several, or
beside a ``streamrl broker``).

``streamrl run`` and ``streamrl actors`` check a config's inputs before they start anything; a
learner node started by hand or by Slurm has no launcher that did, and ``learner`` may not import
``actors``, whose ``inputs`` checks them. So this command checks the policy on this node (the
learner reads no prompts: a missing one stops it in one line naming ``model.path``, before its
run directory is made), then starts the learner as ``python -m streamrl.learner`` would. The
ranks torchrun starts skip it (``RANK`` set).
"""

from __future__ import annotations

import os
import sys

from streamrl.actors import inputs
from streamrl.configs.errors import ConfigError
from streamrl.configs.runfiles import check_run_dir
from streamrl.learner import tracking
from streamrl.learner.__main__ import RUN_DIRS, parse, start


def main(argv: list[str] | None = None) -> int:
    args, cfg = parse(argv)
    if "RANK" not in os.environ:
        try:
            # the run-directory policy before an input is read (``start`` applies it whole)
            check_run_dir(cfg.run.dir, dirs=RUN_DIRS)
            tracking.check_installed(cfg.run)
            inputs.check(cfg.model, None)
        except (ConfigError, FileNotFoundError) as exc:
            print(f"streamrl learner: {exc}", file=sys.stderr)
            return 2
    return start(args, cfg)


if __name__ == "__main__":
    sys.exit(main())
