"""`streamrl plot` reads any run but writes only where its user says: ``<run.dir>/plots`` only in a
run directory nobody else can change, ``--out DIR`` only in a directory of the user's, never
through a link someone planted in the run, each PNG written whole under a temporary name and
renamed into place (0600, or 0644 where the umask lets others read)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from streamrl.configs.errors import ConfigError
from streamrl.launch import plot

PNG = b"\x89PNG\r\n\x1a\n"
OTHER_UID = 65534
MINE = b"the victim's own bytes\n"


def _rows() -> list[dict]:
    return [
        {"step": k, "time": 100.0 + k, "reward_mean": 0.1 * k, "kl": 0.01, "step_s": 1.0}
        for k in range(1, 4)
    ]


def _run(path: Path) -> Path:
    path.mkdir(mode=0o700)
    (path / "learner_steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    return path


def _hand_over(path: Path, how: str) -> None:
    """Make ``path`` a directory another local user controls."""
    if how == "owned-by-another-uid":
        os.chown(path, OTHER_UID, OTHER_UID)
    else:
        path.chmod(0o777)


OTHER_USER_CASES = [
    pytest.param(
        "owned-by-another-uid",
        marks=pytest.mark.skipif(os.geteuid() != 0, reason="only root can chown to another uid"),
    ),
    "others-may-write",
]


def _plant(run: Path, victims: Path, how: str) -> None:
    """What the run's owner planted: ``plots`` a link to the victim's folder, or a folder of
    theirs whose ``steps.png`` is a link to the victim's file."""
    if how == "plots-links-to-a-folder":
        run.joinpath("plots").symlink_to(victims)
    else:
        (run / "plots").mkdir()
        (run / "plots" / "steps.png").symlink_to(victims / "steps.png")


def _victims(tmp_path: Path) -> Path:
    victims = tmp_path / "victims"
    victims.mkdir()
    (victims / "steps.png").write_bytes(MINE)
    return victims


def _untouched(victims: Path) -> bool:
    return sorted(os.listdir(victims)) == ["steps.png"] and (
        (victims / "steps.png").read_bytes() == MINE
    )


@pytest.mark.parametrize("planted", ["plots-links-to-a-folder", "steps-png-links-to-a-file"])
@pytest.mark.parametrize("how", OTHER_USER_CASES)
def test_a_run_another_user_controls_is_refused_in_one_line_naming_out_and_written_through_no_link(
    tmp_path, capsys, how, planted
):
    victims = _victims(tmp_path)
    run = _run(tmp_path / "theirs")
    _plant(run, victims, planted)
    _hand_over(run, how)
    assert plot.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--out DIR" in err, err
    assert _untouched(victims)
    out = tmp_path / "mine" / "plots"
    assert plot.main([str(run), "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["steps.png", "wall_time.png"]
    assert (out / "steps.png").read_bytes()[:8] == PNG
    assert _untouched(victims)


@pytest.mark.parametrize("how", OTHER_USER_CASES)
def test_out_in_a_directory_another_user_controls_is_refused(tmp_path, capsys, how):
    run = _run(tmp_path / "run")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    _hand_over(theirs, how)
    for out in (theirs, theirs / "plots"):
        assert plot.main([str(run), "--out", str(out)]) == 2
        assert "--out" in capsys.readouterr().err
    assert os.listdir(theirs) == []


def test_in_a_run_of_mine_a_link_at_plots_is_refused_and_a_link_inside_it_replaced(
    tmp_path, capsys
):
    victims = _victims(tmp_path)
    run = _run(tmp_path / "run")
    _plant(run, victims, "plots-links-to-a-folder")
    assert plot.main([str(run)]) == 2
    assert "is a link" in capsys.readouterr().err
    assert _untouched(victims)
    (run / "plots").unlink()
    _plant(run, victims, "steps-png-links-to-a-file")
    assert plot.main([str(run)]) == 0
    steps = run / "plots" / "steps.png"
    assert not steps.is_symlink() and steps.read_bytes()[:8] == PNG
    assert _untouched(victims)


@pytest.mark.parametrize(("umask", "mode"), [(0o077, 0o600), (0o022, 0o644), (0o002, 0o644)])
def test_pngs_are_0600_or_0644_as_the_umask_says_and_never_writable_by_others(
    tmp_path, umask, mode
):
    run = _run(tmp_path / "run")
    previous = os.umask(umask)
    try:
        assert plot.main([str(run)]) == 0
        assert plot.main([str(run), "--out", str(tmp_path / "out")]) == 0
    finally:
        os.umask(previous)
    for folder in (run / "plots", tmp_path / "out"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755 & ~umask
        for name in ("steps.png", "wall_time.png"):
            assert stat.S_IMODE((folder / name).stat().st_mode) == mode
        assert [n for n in os.listdir(folder) if n.endswith(".tmp")] == []


def test_a_runs_end_shows_why_it_wrote_no_plots_in_a_run_dir_it_cannot_trust(tmp_path):
    run = _run(tmp_path / "run")
    run.chmod(0o777)
    shown = plot.at_end(run)
    assert isinstance(shown, str) and "--out DIR" in shown
    assert not (run / "plots").exists()
    run.chmod(0o700)
    assert plot.at_end(run) == run / "plots"


@pytest.mark.parametrize("planted", ["a-link-to-a-file-of-mine", "a-fifo-nobody-writes"])
def test_the_step_rows_of_a_foreign_run_are_read_only_from_a_regular_file(tmp_path, planted):
    """A step log planted as a link is not followed, nor a FIFO waited on: one line, no read."""
    run, mine = tmp_path / "run", tmp_path / "mine.jsonl"
    run.mkdir()
    mine.write_text(json.dumps(_rows()[0]) + "\n")
    steps = run / "learner_steps.jsonl"
    if planted == "a-link-to-a-file-of-mine":
        steps.symlink_to(mine)
    else:
        os.mkfifo(steps)
    with pytest.raises(
        ConfigError, match="learner_steps.jsonl is (a symbolic link|not a regular file)"
    ):
        plot.write(run, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
