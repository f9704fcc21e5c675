"""The learner process: ``python -m streamrl.learner --config configs/demo_cpu.yaml [key=value ...]``.

One rank with plain ``python``; several with ``torchrun --nproc_per_node N -m learner ...``
(or the ``deepspeed`` launcher, hence ``--local_rank``). SIGTERM/SIGINT/SIGHUP stop it
after the current step with a checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

import torch

from streamrl.configs import config_from_cli
from streamrl.learner.outcome import FATAL_EXIT, FATAL_MARK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamrl learner", description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    _args, cfg = config_from_cli(parser, argv)
    torch.set_num_threads(cfg.run.torch_threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s learner %(levelname)s %(message)s")

    stop = {"requested": False}

    def request_stop(signum, _frame) -> None:
        logging.info("signal %d: stopping after the current step", signum)
        stop["requested"] = True

    # a flag the loop reads between steps: a step, both its publishes included, always completes
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, request_stop)

    from streamrl.learner.loop import Learner

    learner = Learner(cfg, should_stop=lambda: stop["requested"])
    progress = learner.run(echo=lambda line: print(line, flush=True))
    logging.info("stopped at step %d, version %d", progress.step, progress.version)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if learner.failure:
        # the supervisor shows this line and does not restart the learner (launch.supervisor)
        print(f"{FATAL_MARK} {learner.failure}", flush=True)
        return FATAL_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
