"""``python -m streamrl.learner.torchrun <torchrun's arguments>``: torch's launcher
(``torch.distributed.run``) for this node's ranks, ending quietly on a stop signal.

torch's agent passes SIGTERM/SIGINT (the user's, the supervisor's, Slurm's ``scancel``) on to
the ranks, which stop after their current step with a checkpoint, then raises
``SignalException`` out of its ``main``: a traceback in every node's log of a run that stopped as
asked. Here that is one line and the shell's exit status for the signal.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main as torchrun


def main() -> int:
    try:
        torchrun()
    except SignalException as exc:
        print(f"streamrl learner: stopped by {exc.sigval.name}", file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
