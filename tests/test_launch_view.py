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
    cfg = load_config("configs/demo_cpu.yaml", ["run.target_window=3"], env={})
    steps = [_step(k, 0.5, 0.0) for k in range(1, 6)] + [_step(k, 1.0, 0.9) for k in range(6, 11)]
    snap = Snapshot(at=0.0, version=20, last_step=steps[-1])
    line = plain_line(snap, 12.0)
    assert "reward=1.000 reverse_digits/position=0.900 reverse_digits_exact=0.900" in line
    console = Console(width=120, record=True)
    console.print(live_table(snap, 12.0, []))
    assert "reverse_digits_exact" in console.export_text()
    text = summary(steps, started_unix=1000.0, wall_s=20.0, events=[], cfg=cfg)
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


def test_the_eta_is_to_max_steps_or_max_time_s_whichever_comes_first_and_says_nothing_without_a_rate():
    from streamrl.launch.view import eta_s

    # 60 steps left at 2 steps/s: 30 s; 10 s left of max_time_s
    assert eta_s(40, 40.0, 2.0, max_steps=100, max_time_s=50.0) == 10.0
    assert eta_s(40, 40.0, 2.0, max_steps=100, max_time_s=0.0) == 30.0
    assert eta_s(40, 40.0, 2.0, max_steps=100, max_time_s=600.0) == 30.0
    assert eta_s(40, 40.0, None, max_steps=100, max_time_s=0.0) is None
    assert eta_s(40, 40.0, 2.0, max_steps=0, max_time_s=0.0) is None
    # no rate yet: nothing, not max_time_s's 560 s; without max_steps the time left is the ETA
    assert eta_s(1, 40.0, None, max_steps=100, max_time_s=600.0) is None
    assert eta_s(1, 40.0, None, max_steps=0, max_time_s=600.0) == 560.0
    # a 3-step run whose steps were all first seen together ends at ETA 0
    assert eta_s(3, 42.0, None, max_steps=3, max_time_s=600.0) == 0.0


def test_the_bar_shows_step_n_of_max_steps_and_the_eta_at_the_rate_since_the_first_step_seen():
    from streamrl.launch.view import RunProgress

    progress = RunProgress(max_steps=100, max_time_s=0.0)
    # a resumed run's first step seen is 10, 20 s after the launch: start-up is not in the rate
    progress.update(10, 20.0)
    progress.update(30, 30.0)
    assert progress.eta == 35.0
    console = Console(width=120, record=True)
    console.print(progress.bar)
    text = console.export_text()
    assert "step 30/100" in text and "30%" in text and "ETA 0:00:35" in text
    assert progress.text() == "step 30/100 ETA 0:00:35"
    # without max_steps the bar runs over max_time_s
    timed = RunProgress(max_steps=0, max_time_s=600.0)
    timed.update(5, 150.0)
    console = Console(width=120, record=True)
    console.print(timed.bar)
    text = console.export_text()
    assert "step 5 " in text and "25%" in text
    assert timed.eta == 450.0


def test_without_a_terminal_a_line_goes_out_per_block_of_steps():
    from streamrl.launch.view import plain_due, plain_every

    assert plain_every(200) == 10 and plain_every(5) == 1 and plain_every(0) == 10
    printed, last = [], None
    for step in [0, 1, 1, 4, 9, 10, 12, 19, 23, 40]:
        if plain_due(step, last, 10):
            printed.append(step)
            last = step
    assert printed == [1, 10, 23, 40]
    snap = Snapshot(at=0.0, version=2, last_step=_step(1, 0.5, 0.0))
    from streamrl.launch.view import RunProgress

    progress = RunProgress(max_steps=50, max_time_s=0.0)
    progress.update(1, 3.0)
    assert plain_line(snap, 3.0, progress).startswith("[    3s] step 1/50 ETA -:--:-- v2 ")


def test_the_summary_ends_with_where_the_plots_went():
    text = summary([_step(1, 0.5, 0.0)], 1000.0, 5.0, [], plots="runs/x/plots")
    assert text.splitlines()[-1] == "  plots                runs/x/plots"


def test_the_view_and_the_summary_show_how_far_off_policy_the_data_was():
    """The live view: the last step's ESS, KL(mu || pi_prox), IS-cap and stale shares. The summary:
    their means over the steps that trained (a step with NaN figures trained nothing and is left
    out), and the learner's idle share."""
    steps = [
        {**_step(k, 0.5, 0.0), "is_ess": ess, "behaviour_kl": kl, "is_truncated_fraction": 0.02,
         "stale_token_fraction": stale, "learner_idle_fraction": idle}
        for k, (ess, kl, stale, idle) in enumerate(
            [(0.9, 2e-3, 0.1, 0.5), (0.8, 4e-3, 0.3, 0.3), (float("nan"), float("nan"), 0.2, 0.4)],
            start=1,
        )
    ]  # fmt: skip
    console = Console(width=120, record=True)
    console.print(live_table(Snapshot(at=0.0, version=4, last_step=steps[1]), 3.0, []))
    assert "ESS 0.800  KL(mu||pi_prox) 4.00e-03  capped 2.0%  stale 30.0%" in console.export_text()
    text = summary(steps, started_unix=1000.0, wall_s=5.0, events=[])
    assert (
        "  off-policy           IS ESS mean 0.850, KL(mu||pi_prox) mean 3.00e-03, stale tokens 20.0%"
        in text
    )
    assert "  learner idle         40% of its time (waiting for data)" in text


def test_a_trainer_in_this_process_gets_the_bar_on_a_terminal_and_its_words_elsewhere(capsys):
    """``streamrl sft`` / ``dpo``: each step's line, and step N/total with the ETA at the observed
    rate; no ETA before a rate, 0 at the last step."""
    import io

    from streamrl.launch.view import StepBar

    plain = StepBar(max_time_s=600.0, console=Console(file=io.StringIO(), force_terminal=False))
    plain.step("step 1 loss 0.5", 1, 3)
    plain.step("step 3 loss 0.2", 3, 3)
    plain.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("step 1/3 ETA -:--:--  step 1 loss 0.5")
    assert lines[1].endswith("step 3/3 ETA 0:00:00  step 3 loss 0.2")

    console = Console(width=100, record=True, force_terminal=True, file=io.StringIO())
    bar = StepBar(max_time_s=0.0, console=console)
    bar.step("step 2 loss 0.4", 2, 4)
    bar.close()
    text = console.export_text()
    assert "step 2 loss 0.4" in text and "step 2/4" in text and "50%" in text
