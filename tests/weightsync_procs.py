"""Real processes for the weightsync tests: ``subscriber`` (an actor's weight path) and ``publisher``.

Started with ``python tests/weightsync_procs.py ROLE ...`` as unrelated
processes (not fork children), so shared memory and the dist rendezvous are
exercised exactly as separate actor and learner processes use them.

Every tensor of version v holds the constant ``fill(v, i)``, so a copy mixing
two versions (a torn read) is detected on every element.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fill(version: int, index: int) -> float:
    return float(version * 100 + index)


def engine_template(hidden: int, layers: int) -> dict[str, torch.Tensor]:
    """Engine-side names like a tied-embedding causal LM: lm_head shares embed_tokens' storage."""
    embed = torch.zeros(32, hidden)
    params = {"model.embed_tokens.weight": embed}
    for k in range(layers):
        params[f"model.layers.{k}.mlp.weight"] = torch.zeros(hidden, hidden)
        params[f"model.layers.{k}.norm.weight"] = torch.zeros(hidden)
    params["lm_head.weight"] = embed
    return params


def learner_tensors(version: int, hidden: int, layers: int) -> dict[str, torch.Tensor]:
    """Learner-side names as a DeepSpeed-wrapped state_dict: ``module.`` prefixes, tied lm_head listed too."""
    out = {}
    for i, (name, t) in enumerate(engine_template(hidden, layers).items()):
        if name == "lm_head.weight":
            out["module." + name] = out["module.model.embed_tokens.weight"]
        else:
            out["module." + name] = torch.full(t.shape, fill(version, i))
    return out


def check(version: int, tensors: dict[str, torch.Tensor], hidden: int, layers: int) -> bool:
    names = list(engine_template(hidden, layers))
    return all(bool((tensors[n] == fill(version, names.index(n))).all()) for n in tensors)


def config(args) -> SimpleNamespace:
    """The three sections a publisher and a subscriber take (a whole ``Config`` would also check
    the actors it has none of, e.g. the CUDA actors cuda_ipc wants)."""
    from streamrl.configs.schema import BrokerConfig, RunConfig, WeightSyncConfig

    return SimpleNamespace(
        run=RunConfig(name=args.run, dir="/tmp"),
        broker=BrokerConfig(redis_url=args.redis),
        weightsync=WeightSyncConfig.model_validate_json(args.weightsync),
    )


def subscriber(args) -> None:
    from streamrl.weightsync.subscriber import Subscriber

    template = engine_template(args.hidden, args.layers)
    cfg = config(args)
    sub = Subscriber.from_config(cfg.weightsync, cfg.broker, cfg.run, args.id, template).start()
    print(json.dumps({"event": "started", "pid": os.getpid()}), flush=True)
    deadline = time.monotonic() + args.duration
    seen = []
    while time.monotonic() < deadline:
        staged = sub.take_staged()
        if staged is None:
            time.sleep(0.002)
            continue
        version, tensors = staged
        ok = check(version, tensors, args.hidden, args.layers)
        for name, t in tensors.items():
            template[name].copy_(t)
        sub.applied(version)
        seen.append(version)
        print(json.dumps({"event": "applied", "version": version, "ok": ok}), flush=True)
        if version >= args.until:
            break
    sub.close()
    print(
        json.dumps({"event": "done", "seen": seen, "failures": sub.failures, "lag": sub.lag}),
        flush=True,
    )


def publisher(args) -> None:
    from streamrl.weightsync.publisher import Publisher

    cfg = config(args)
    pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
    for version in range(args.until + 1):
        pub.publish(version, learner_tensors(version, args.hidden, args.layers))
        print(json.dumps({"event": "published", "version": version}), flush=True)
        time.sleep(args.period)
    # stay alive holding the segment until killed
    time.sleep(args.duration)
    pub.close()


def main(argv: list[str] | None = None) -> None:
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["subscriber", "publisher"])
    parser.add_argument("--redis", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--id", default="a0")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    # the weightsync section, as JSON
    parser.add_argument("--weightsync", default='{"timeout_s": 5.0}')
    parser.add_argument("--until", type=int, default=10)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--period", type=float, default=0.0)
    args = parser.parse_args(argv)
    {"subscriber": subscriber, "publisher": publisher}[args.role](args)


if __name__ == "__main__":
    main()
