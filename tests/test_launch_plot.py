"""`streamrl plot RUN_DIR`: the PNGs draw exactly the learner's step rows."""

from __future__ import annotations

import json
import os
import sys

import pytest

from streamrl.launch import plot


def _rows() -> list[dict]:
    rows = []
    for k in range(1, 7):
        row = {
            "step": k,
            "time": 1000.0 + 1.5 * k,
            "reward_mean": 0.1 * k,
            "reward_parts": {"exact": 0.05 * k, "format": 1.0 - 0.1 * k},
            "kl": 0.001 * k,
            "entropy": 3.0 - 0.1 * k,
            "tokens_per_s": 100.0 + k,
            "staleness_mean": 0.5 * (k % 3),
            "staleness_max": k % 3,
            "wait_s": 0.25,
            "step_s": 1.0 + 0.01 * k,
            "is_ess": 1.0 - 0.02 * k,
            "behaviour_kl": 1e-4 * k,
            "is_truncated_fraction": 0.01 * k,
            "stale_token_fraction": 0.03 * (k % 2),
            "learner_idle_fraction": 0.2,
            "reward_std": 0.3 + 0.01 * k,
            "loss": -0.1 * k,
            "grad_norm": 1.0 + k,
            "lr": 1e-3 / k,
            "clip_fraction": 0.05,
            "completions": {"mean_length": 5.0 + k, "max_length": 9.0 + k, "clipped_ratio": 0.1},
        }
        rows.append(row)
    # a step that trained nothing has no kl or entropy: the line skips it
    del rows[3]["kl"], rows[3]["entropy"]
    return rows


def _drawn(fig) -> dict[str, dict[str, tuple[list, list]]]:
    return {
        ax.get_title(): {
            line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
            for line in ax.get_lines()
        }
        for ax in fig.axes
    }


@pytest.mark.parametrize("x", ["step", "wall_s"])
def test_every_panel_draws_the_step_rows_values_against_steps_and_wall_time(x):
    rows = _rows()
    drawn = _drawn(plot.figure(rows, x))
    # wall time from the run's start: the first row's end less its wait and step time
    start = 1001.5 - 0.25 - 1.01
    xs = [r["step"] if x == "step" else r["time"] - start for r in rows]
    assert drawn["reward"]["reward"] == (xs, [r["reward_mean"] for r in rows])
    assert drawn["reward"]["format"] == (xs, [r["reward_parts"]["format"] for r in rows])
    assert drawn["reward"]["exact"] == (xs, [r["reward_parts"]["exact"] for r in rows])
    kept = [i for i, r in enumerate(rows) if "kl" in r]
    assert drawn["KL"]["kl"] == ([xs[i] for i in kept], [rows[i]["kl"] for i in kept])
    assert drawn["entropy"]["entropy"][1] == [rows[i]["entropy"] for i in kept]
    assert drawn["KL"]["KL(mu || pi_prox)"] == (xs, [r["behaviour_kl"] for r in rows])
    shares = drawn["shares"]
    assert shares["IS ESS"] == (xs, [r["is_ess"] for r in rows])
    assert shares["at the IS cap"][1] == [r["is_truncated_fraction"] for r in rows]
    assert shares["stale tokens"][1] == [r["stale_token_fraction"] for r in rows]
    assert shares["learner idle"][1] == [0.2] * len(rows)
    assert shares["clip fraction"][1] == [0.05] * len(rows)
    assert shares["completions at the token budget"][1] == [0.1] * len(rows)
    assert drawn["reward std (within groups)"]["reward std"][1] == [r["reward_std"] for r in rows]
    assert drawn["loss"]["loss"][1] == [r["loss"] for r in rows]
    assert drawn["grad norm"]["grad norm"][1] == [r["grad_norm"] for r in rows]
    assert drawn["learning rate"]["lr"][1] == [r["lr"] for r in rows]
    lengths = drawn["completion length (tokens)"]
    assert lengths["mean"][1] == [r["completions"]["mean_length"] for r in rows]
    assert lengths["max"][1] == [r["completions"]["max_length"] for r in rows]


def test_the_wall_time_axis_starts_at_the_runs_launch_so_start_up_is_on_it(tmp_path):
    """A run launched 30 s before its first step ended: the first step sits at 30 s + its own time
    on the axis, not at its own time alone; a launch after the first row (a resumed run's new
    launch) does not push earlier rows below 0."""
    rows = _rows()
    first_end = rows[0]["time"]
    drawn = _drawn(plot.figure(rows, "wall_s", started=first_end - 30.0))
    xs = drawn["reward"]["reward"][0]
    # differences of times near 1000 s: float64 rounds them at ~1e-13
    assert xs[0] == pytest.approx(30.0, abs=1e-9)
    assert xs[-1] == pytest.approx(rows[-1]["time"] - first_end + 30.0, abs=1e-9)
    resumed = _drawn(plot.figure(rows, "wall_s", started=rows[2]["time"]))
    assert resumed["reward"]["reward"][0][0] == pytest.approx(0.25 + 1.01, abs=1e-9)
    (tmp_path / "run.json").write_text(json.dumps({"started": first_end - 30.0}))
    os.chmod(tmp_path, 0o700)
    assert plot.launched(tmp_path) == first_end - 30.0
    (tmp_path / "run.json").write_text("{not json")
    assert plot.launched(tmp_path) is None
    assert drawn["tokens/s trained"]["tokens/s"] == (xs, [r["tokens_per_s"] for r in rows])
    assert drawn["staleness (versions)"]["max"][1] == [float(r["staleness_max"]) for r in rows]
    assert drawn["time per phase (s)"]["training"] == (xs, [r["step_s"] for r in rows])
    assert drawn["time per phase (s)"]["waiting for data"][1] == [0.25] * len(rows)


def test_the_command_writes_both_pngs_and_names_the_extra_without_matplotlib(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "learner_steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    assert plot.main([str(tmp_path)]) == 0
    for name in ("steps.png", "wall_time.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.main([str(tmp_path / "nowhere")]) == 2
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert plot.main([str(tmp_path)]) == 2
    assert "pip install 'streamrl[plot]'" in capsys.readouterr().err
