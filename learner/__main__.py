"""The learner: ``streamrl learner --config X [key=value ...]`` (``python -m streamrl.learner``).

One rank with ``learner.ranks: 1``; with more it starts torchrun on this node, which starts
``learner.ranks`` ranks of this same module. Several nodes: each runs ``streamrl learner
--join REDIS_URL --nnodes N --node-rank R --rdzv-endpoint HOST:PORT`` with the same config, meeting through
torchrun's static rendezvous at node 0 (``learner.nodes``); checkpoints then need one ``run.dir`` that every
node sees (``learner.checkpoint.check_shared``). Under torchrun or the ``deepspeed`` launcher
(``RANK`` set, hence ``--local_rank``) it is one rank. SIGTERM/SIGINT/SIGHUP stop it after the
current step with a checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from urllib.parse import urlsplit

import redis

from streamrl.broker.password import PasswordError, add_join_argument, join_url
from streamrl.configs import config_from_cli
from streamrl.configs.errors import ConfigError, StreamRLError
from streamrl.configs.runfiles import enter_run_dir
from streamrl.configs.schema import BrokerConfig, Config, LearnerConfig, RunConfig
from streamrl.learner import tracking
from streamrl.learner.nodes import (
    Nodes,
    NodesError,
    Placement,
    choose_address,
    exposure_warning,
    host_view,
    interface_env,
    rendezvous_id,
    torchrun_argv,
)
from streamrl.learner.outcome import FATAL_EXIT, FATAL_MARK
from streamrl.weightsync.transports.shm.segment import unlink_on_stop

# what the learner writes below run.dir, never through a link (configs.runfiles); its files there
# (steps, commits, tracker ids) are written through no link either (runtime.jsonl_log, write_new)
RUN_DIRS = ("checkpoints",)


def _meeting(
    args: argparse.Namespace, run: RunConfig, broker: BrokerConfig
) -> tuple[Nodes, Placement, str]:
    """This node's part of several: its address and the run's rendezvous id (from the broker)."""
    from streamrl.broker.client import connect_sync, redis_url
    from streamrl.broker.keys import Keys

    if not args.rdzv_endpoint:
        raise NodesError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (on node 0)")
    nodes = Nodes(args.nnodes, args.node_rank, args.rdzv_endpoint, args.max_restarts)
    url = redis_url(broker, run.dir)
    placement = choose_address(nodes, host_view(nodes, urlsplit(url).hostname, os.environ))
    try:
        with connect_sync(broker, run.dir) as client:
            rdzv_id = rendezvous_id(client, Keys.from_config(run, broker).learner_rdzv)
    except redis.RedisError as exc:
        raise NodesError(f"the rendezvous id from the broker ({exc})") from None
    return nodes, placement, rdzv_id


def _launch_ranks(
    args: argparse.Namespace, learner: LearnerConfig, run: RunConfig, broker: BrokerConfig
) -> int:
    """Become torchrun for this node's ``learner.ranks`` ranks (one node, or this node of several)."""
    rank_argv = (["--config", args.config] if args.config else []) + list(args.overrides)
    env = dict(os.environ)
    meeting = ()
    if args.nnodes > 1:
        try:
            meeting = _meeting(args, run, broker)
        except (NodesError, StreamRLError) as exc:
            print(f"streamrl learner: {exc}", file=sys.stderr)
            return 2
        nodes, placement, _ = meeting
        env.update(interface_env(placement, env))
        warning = exposure_warning(nodes, placement, learner.trusted_network)
        if warning:
            print(warning, file=sys.stderr, flush=True)
    argv = torchrun_argv(sys.executable, learner.ranks, rank_argv, *meeting)
    sys.stdout.flush()
    os.execve(sys.executable, argv, env)


def _check_shared_run_dir(run_dir: str, host_id: str) -> None:
    """Before the policy loads: every rank must see one run.dir (``checkpoint.check_shared``)."""
    from streamrl.learner import checkpoint
    from streamrl.learner.engine import device, init_distributed

    rank, world = init_distributed()
    checkpoint.check_shared(Path(run_dir) / "checkpoints", rank, world, device(), host_id)


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, Config]:
    """The command line and the config it names, with ``--join``'s URL as the broker's."""
    parser = argparse.ArgumentParser(prog="streamrl learner", description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--nnodes", type=int, default=1, help="nodes the learner runs on")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's rank, 0..nnodes-1")
    parser.add_argument(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="with --nnodes > 1: where node 0 serves torchrun's rendezvous store, an address (or "
        "name) of node 0 and a free port",
    )
    add_join_argument(parser)
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="with --nnodes > 1: times torchrun restarts every node's ranks after one fails",
    )
    args, cfg = config_from_cli(parser, argv)
    if args.join:
        try:
            url = join_url(args.join, cfg.broker)
        except PasswordError as exc:
            print(f"streamrl learner: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        # torchrun's ranks (and their restarts) read it from the environment, as the config does
        os.environ["REDIS_URL"] = url
        cfg = cfg.model_copy(update={"broker": cfg.broker.model_copy(update={"redis_url": url})})
    return args, cfg


def main(argv: list[str] | None = None) -> int:
    return start(*parse(argv))


def start(args: argparse.Namespace, cfg: Config) -> int:
    """This node's ranks under torchrun, or (under torchrun, or one rank) the learner itself."""
    if "RANK" not in os.environ and (args.nnodes > 1 or cfg.learner.ranks > 1):
        return _launch_ranks(args, cfg.learner, cfg.run, cfg.broker)
    # the run-directory policy: what it writes in run.dir (steps, checkpoints, TensorBoard) is
    # its user's only, in a directory only its user can change; a restart would find the same
    # directory, so a refusal is FATAL_EXIT, which no supervisor restarts
    try:
        tracking.check_installed(cfg.run)
        enter_run_dir(cfg.run.dir, cfg.run.shared_read, dirs=RUN_DIRS)
    except ConfigError as exc:
        print(f"{FATAL_MARK} {exc}", flush=True)
        return FATAL_EXIT
    import torch

    torch.set_num_threads(cfg.run.torch_threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s learner %(levelname)s %(message)s")

    stop = {"requested": False}

    def request_stop(signum, _frame) -> None:
        logging.info("signal %d: stopping after the current step", signum)
        stop["requested"] = True
        # a kill before the step ends (torchrun's, Slurm's) must not leave the segment behind
        unlink_on_stop()

    # a flag the loop reads between steps: a step, both its publishes included, always completes
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, request_stop)

    from streamrl.learner.grpo import GRPO

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from streamrl.learner.checkpoint import CheckpointDirNotShared

        try:
            _check_shared_run_dir(cfg.run.dir, cfg.run.host_id)
        # a restart would find the same filesystems: FATAL_EXIT, which no supervisor restarts
        except CheckpointDirNotShared as exc:
            print(f"{FATAL_MARK} {exc}", flush=True)
            return FATAL_EXIT

    learner = GRPO(cfg, should_stop=lambda: stop["requested"])
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
