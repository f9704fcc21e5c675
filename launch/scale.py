"""Change the number of actors of a running `make run` without restarting anything.

    streamrl scale --config configs/demo_cpu.yaml --actors 4                  (make scale ACTORS=4)
    streamrl scale --join redis://10.77.0.1:6379/0 --host C --actors 4 [key=value ...]

The supervisor reads the wanted count from a Redis list. ``--host H`` scales the actors that
``streamrl actors`` supervises on host H instead (``launch.host``; each host has a list of
its own). ``--join`` names the run's broker on another host, as ``streamrl actors --join`` does:
the password comes from ``STREAMRL_REDIS_PASSWORD`` or ``broker.password_file``, never the URL.
The command is signed with the supervisor's key (``launch.control``), which this reads from the
supervisor's state in ``run.dir`` (``<run.dir>/hosts/H/scale.key`` with ``--host H``), so it runs
where that file is: on the host itself, or wherever the operator shares or copies it
(``--key-file``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.broker.password import add_join_argument, join_url
from streamrl.configs import StreamRLError, config_from_cli
from streamrl.configs.runfiles import check_run_dir, read_run_file
from streamrl.launch import control
from streamrl.launch.host import host_dir


def _parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="streamrl scale", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--actors", type=int, required=True, help="wanted number of supervised actors"
    )
    parser.add_argument(
        "--host",
        metavar="HOST_ID",
        help="scale the actors `streamrl actors` supervises on this host (its run.host_id) "
        "instead of those of `streamrl run`",
    )
    add_join_argument(parser)
    parser.add_argument(
        "--key-file",
        metavar="PATH",
        help=f"the supervisor's {control.KEY_FILE} (default: in its state directory under run.dir)",
    )
    args, cfg = config_from_cli(parser, argv)
    if not 0 <= args.actors <= cfg.actor.max_actors:
        parser.error(f"--actors must be between 0 and actor.max_actors={cfg.actor.max_actors}")
    return args, cfg


def read_key(args: argparse.Namespace, run_dir: str) -> bytes:
    """The supervisor's key: ``--key-file``, else the file in its state under ``run_dir``, read
    under the run-directory policy (``configs.runfiles``: ConfigError unless only this user can
    change the directory and the file is a regular file of this user's, no link)."""
    if args.key_file:
        return Path(args.key_file).read_text().strip().encode()
    below = f"{host_dir('', args.host)}/" if args.host else ""
    check_run_dir(run_dir, dirs=(below,) if below else ())
    return read_run_file(run_dir, below + control.KEY_FILE).strip().encode()


def main(argv: list[str] | None = None) -> int:
    args, cfg = _parse(argv)
    state = host_dir(cfg.run.dir, args.host) if args.host else Path(cfg.run.dir)
    key_file = Path(args.key_file) if args.key_file else state / control.KEY_FILE
    try:
        key = read_key(args, cfg.run.dir)
        broker = cfg.broker
        if args.join:
            broker = broker.model_copy(update={"redis_url": join_url(args.join, cfg.broker)})
        # without a URL of its own, the one the run's broker wrote there (same policy)
        client = connect_sync(broker, cfg.run.dir)
    except OSError as exc:
        print(
            f"streamrl scale: cannot read the supervisor's key {key_file}: {exc.strerror} "
            "(run this on the supervisor's host, or pass --key-file)",
            file=sys.stderr,
        )
        return 2
    except StreamRLError as exc:
        print(f"streamrl scale: {exc}", file=sys.stderr)
        return 2
    list_key = Keys.from_config(cfg.run, cfg.broker).launch_control
    if args.host:
        list_key = control.control_key(list_key, args.host)
    try:
        client.rpush(list_key, control.encode(key, list_key, args.actors))
    finally:
        client.close()
    where = f" on host {args.host!r}" if args.host else ""
    print(f"asked the supervisor of run {cfg.run.name!r}{where} for {args.actors} actors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
