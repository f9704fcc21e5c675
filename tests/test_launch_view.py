"""The live view and the end-of-run summary report whatever reward parts the task has."""

from __future__ import annotations

from rich.console import Console

from streamrl.configs import load_config
from streamrl.launch.status import Snapshot
from streamrl.launch.view import live_table, plain_line, summary


def _step(step: int, reward: float, exact: float) -> dict:
    return {
        "step": step,
        "version": 2 * step,
        "reward_mean": reward,
        "reward_parts": {"reverse_digits/position": reward * 0.9, "reverse_digits_exact": exact},
        "tokens": 100,
        "step_s": 1.0,
        "staleness_mean": 1.0,
        "time": 1000.0 + step,
    }


def test_the_view_and_the_summary_show_each_reward_part_and_the_target_in_its_terms():
    run = load_config("configs/demo_cpu.yaml", ["run.target_window=3"], env={}).run
    steps = [_step(k, 0.5, 0.0) for k in range(1, 6)] + [_step(k, 1.0, 0.9) for k in range(6, 11)]
    snap = Snapshot(at=0.0, version=20, last_step=steps[-1])
    line = plain_line(snap, 12.0)
    assert "reward=1.000 reverse_digits/position=0.900 reverse_digits_exact=0.900" in line
    console = Console(width=120, record=True)
    console.print(live_table(snap, 12.0, []))
    assert "reverse_digits_exact" in console.export_text()
    text = summary(steps, started_unix=1000.0, wall_s=20.0, events=[], run=run)
    assert "    reverse_digits_exact 0.000 -> 0.900" in text
    # the first 3-step window reaching both bars closes at step 8 (time 1008)
    assert (
        "target               3-step means of reward >= 0.95 and reverse_digits_exact >= 0.85: "
        "reached at 8 s" in text
    )


def test_the_view_skips_a_beat_while_redis_is_down_and_resumes_when_it_is_back(tmp_path):
    """Redis dying under the launcher's view must not end the run: the supervisor restarts it."""
    from streamrl.broker.client import connect_sync
    from streamrl.broker.keys import Keys
    from streamrl.broker.server import EmbeddedRedis
    from streamrl.launch.run import refresh

    cfg = load_config("configs/demo_cpu.yaml").model_copy()
    cfg.broker.retries = 1
    server = EmbeddedRedis(cfg.broker, tmp_path / "redis").start()
    try:
        cfg.broker.redis_url = server.url
        client = connect_sync(cfg.broker, cfg.run.dir)
        keys = Keys(cfg.run.name)
        prom = tmp_path / "prom"
        assert refresh(cfg.broker.consumer_group, client, keys, tmp_path, prom) is not None
        server.proc.kill()
        server.proc.wait()
        assert refresh(cfg.broker.consumer_group, client, keys, tmp_path, prom) is None
        server.restart()
        snap = refresh(cfg.broker.consumer_group, client, keys, tmp_path, prom)
        assert snap is not None and snap.version == 0
    finally:
        server.stop()
