"""A SIGTERM reaches the learner at any moment of a step; the step completes, both its publishes
included, and the learner stops at the step boundary with a checkpoint of exactly that step and no
shared-memory segment left behind. The signal is delivered from a hook right after the step's
first publish (a real signal to a real learner process, not a race against the clock)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import redis
from learner_rollouts import xadd_groups
from test_learner_processes import (
    GROUPS_PER_STEP,
    ROOT,
    TIMEOUT_S,
    _assert_same_weights,
    _checkpoint_weights,
    _config,
    _env,
    _in_process_weights,
    _overrides,
    _steps_logged,
    _stream_of,
)

from streamrl.broker.keys import Keys
from streamrl.weightsync.transports.shm.segment import SHM_DIR, segment_prefix

# The learner's own entry point, with SIGTERM sent to itself as soon as the version in argv[1]
# (the first of a step's two) is published: the handler runs before the step's second publish.
SIGNAL_BETWEEN_PUBLISHES = """
import os, signal, sys
from streamrl.learner.rollout_io import RolloutIO

publish = RolloutIO.publish

def publish_then_signal(self, version, *args, **kwargs):
    publish(self, version, *args, **kwargs)
    if version == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGTERM)

RolloutIO.publish = publish_then_signal
from streamrl.learner.__main__ import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_sigterm_between_the_two_publishes_of_a_step_stops_after_that_step(
    redis_cfg, demo_policy, tmp_path
):
    run_id = redis_cfg.run.name
    common = dict(
        run={"max_steps": 10},
        # two publishes per step; no checkpoint until the stop, so one due then holds the entries
        learner={"minibatches": 2, "checkpoint_every": 1000, "read_timeout_s": 60},
    )
    stopped = _config(
        redis_cfg, demo_policy, f"{run_id}-stopped", tmp_path,
        weightsync={"transport": "shm"}, **common,
    )  # fmt: skip
    straight = _config(
        redis_cfg, demo_policy, f"{run_id}-straight", tmp_path,
        **{**common, "run": {"max_steps": 2}},
    )  # fmt: skip
    groups = _stream_of(demo_policy, 3, seed=7)
    xadd_groups(stopped, groups)
    xadd_groups(straight, groups[: 2 * GROUPS_PER_STEP])
    script = tmp_path / "signal_between_publishes.py"
    script.write_text(SIGNAL_BETWEEN_PUBLISHES)

    # step 2 publishes versions 3 and 4: the signal lands between them
    done = subprocess.run(
        [sys.executable, str(script), "3", *_overrides(stopped)],
        env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["step"] for r in _steps_logged(stopped)] == [1, 2]
    keys = Keys.from_config(stopped.run, stopped.broker)
    client = redis.Redis.from_url(stopped.broker.redis_url)
    try:
        assert int(client.get(keys.version)) == 4
        assert int(client.hget(keys.weights, "version")) == 4
        # the checkpoint at the stop holds steps 1 and 2: their entries are acked, step 3's are not
        assert client.scard(keys.trained) == 2 * GROUPS_PER_STEP
    finally:
        client.close()
    assert not list(SHM_DIR.glob(segment_prefix(stopped.run.name) + "*"))
    # the checkpoint is two whole steps, not three updates labelled as one step
    _assert_same_weights(_checkpoint_weights(stopped), _in_process_weights(straight), atol=1e-6)
