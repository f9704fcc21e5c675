"""One run-directory policy on every command (``configs.runfiles``): each command is classified,
and each that writes or reads its own ``run.dir`` refuses one another user could change, and a
link planted in it, in one line naming ``run.dir``, having written nothing.

Every ``streamrl`` command is listed in ``POLICY``: a writer (it enters its run directory with
``enter_run_dir``, or ``launch.rundir.prepare`` for ``run``), a reader of its own run (it
checks the directory with ``check_run_dir`` and reads its files with ``read_run_file``), a reader
of a foreign run (its outputs go only where the user says; tested where it lives), or a
command that touches no run directory, or ``example``, which makes an example's inputs at paths
its user names and is held to the same rules there; a new command fails the first test until it
is placed.
Each writer and reader runs as a user types it (``python -m streamrl ...``), against a run
directory of another uid (root: chowned to 65534; any other user: below a directory others may
write, which is the same refusal to ``check_trusted``) and against one holding a planted link;
refusals come at start, before a model, Redis or torch loads, so each costs about one Python
start. A fresh run directory made by ``broker``, ``actors --join`` and ``sft`` is 0700 and what
they write there is 0600, whatever umask they were started with.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from dir_fingerprint import fingerprint

from streamrl.broker.password import PASSWORD_ENV
from streamrl.launch.cli import COMMANDS

OTHER_UID = 65534
ATTACKER_URL = "redis://:attacker@127.0.0.1:1/0\n"


class Writer(NamedTuple):
    """A command that writes in ``run.dir``; ``link``: a directory it writes, planted as a link."""

    args: tuple[str, ...]
    link: str


class OwnReader(NamedTuple):
    """A command that reads its own run's files (its key, its ``redis.url``) and writes none."""

    args: tuple[str, ...]


class ForeignReader(NamedTuple):
    """Reads a run that may be another user's; writes only where the user says."""

    tested_in: str


class NoRunDir(NamedTuple):
    why: str


class InputMaker(NamedTuple):
    """Makes an example's inputs at paths its user names (``streamrl example``), as a writer
    makes a run's files: the folder of each path is checked as ``run.dir`` is, a link at a path
    is refused, and what it makes is its user's only (0700/0600 whatever the umask:
    tests/test_demo_task.py)."""

    args: tuple[str, ...]


CONFIG = ("--config", "demo_cpu")
POLICY = {
    "run": Writer((*CONFIG, "--actors", "1"), "logs"),
    "broker": Writer((*CONFIG, "broker.port=0"), "redis"),
    "learner": Writer(CONFIG, "checkpoints"),
    "sft": Writer(("--config", "sft_cpu"), "checkpoints"),
    "dpo": Writer(("--config", "dpo_cpu"), "checkpoints"),
    # a broker that is not there: the refusal comes before it is reached
    "actors": Writer((*CONFIG, "--join", "redis://127.0.0.1:1/0", "--count", "0"), "hosts"),
    "export": Writer(CONFIG, "checkpoints"),
    # its Prometheus config, targets and data
    "dashboard": Writer((*CONFIG, "--port", "0", "--view-port", "0"), "prometheus"),
    # the supervisor's scale.key and the run's redis.url
    "scale": OwnReader((*CONFIG, "--actors", "1")),
    "plot": ForeignReader("tests/test_plot_outputs.py"),
    # names from Redis are names (tests/test_shm_segment_names.py); it finds the run's Redis as
    # every command does (a planted redis.url: below)
    "inspect": ForeignReader("tests/test_cli_inspect.py"),
    "example": InputMaker(("demo",)),
    "config": NoRunDir(
        "reads only the file --config names (a run directory's saved config.yaml, parsed, "
        "nothing imported) and writes only where --out says"
    ),
}
WRITERS = sorted(name for name, kind in POLICY.items() if isinstance(kind, Writer))
READERS = sorted(name for name, kind in POLICY.items() if isinstance(kind, OwnReader))


def test_every_command_is_classified_under_the_run_directory_policy():
    assert sorted(POLICY) == sorted(COMMANDS), (
        "a command was added or removed: place it in POLICY (writer, reader of its own run, "
        "reader of a foreign run, or no run directory, with why) and hold it to the policy"
    )
    for name, kind in POLICY.items():
        if isinstance(kind, ForeignReader):
            assert Path(kind.tested_in).exists(), name
        if isinstance(kind, NoRunDir):
            assert kind.why, name


def streamrl(name: str, run_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.getcwd(), **{PASSWORD_ENV: "pw"})
    env.pop("REDIS_URL", None)
    where = ["--run-dir", str(run_dir)] if name == "dashboard" else [f"run.dir={run_dir}"]
    return subprocess.run(
        [sys.executable, "-m", "streamrl", name, *args, *where],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def refused(done: subprocess.CompletedProcess, *said: str) -> str:
    """The one line a refusal prints; it names run.dir and each of ``said``."""
    return refused_line(done, "run.dir", *said)


def refused_line(done: subprocess.CompletedProcess, *said: str) -> str:
    """The one line a refusal prints; it names each of ``said``."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    for word in said:
        assert word in lines[0], lines[0]
    return lines[0]


def another_users(tmp_path: Path) -> tuple[Path, str]:
    """A run directory holding what a run reads (a config naming a reward of the other user's, a
    URL of their Redis, a scale key), which another local user could change, and why it is
    refused: root makes it another uid's; any other user puts it below a directory others may
    write (non-sticky, unlike /tmp), which ``check_trusted`` refuses for root too."""
    parent = tmp_path / "shared"
    run_dir = parent / "run"
    run_dir.mkdir(parents=True, mode=0o700)
    (run_dir / "config.yaml").write_text("reward: {functions: [{fn: evil:reward}]}\n")
    (run_dir / "redis.url").write_text(ATTACKER_URL)
    (run_dir / "scale.key").write_text("00" * 32 + "\n")
    if os.geteuid() == 0:
        for path in (run_dir, *run_dir.iterdir()):
            os.chown(path, OTHER_UID, OTHER_UID)
        return run_dir, f"owned by uid {OTHER_UID}"
    parent.chmod(0o777)
    return run_dir, "writable by group and others"


@pytest.mark.parametrize("name", WRITERS + READERS)
def test_a_run_dir_another_user_could_change_is_refused_at_start_and_nothing_is_written(
    tmp_path, name
):
    run_dir, why = another_users(tmp_path)
    before = fingerprint(tmp_path)
    done = streamrl(name, run_dir, *POLICY[name].args, cwd=tmp_path)
    refused(done, why)
    assert fingerprint(tmp_path) == before


def make_example(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamrl", "example", *POLICY["example"].args, *args],
        cwd=cwd, env=dict(os.environ, PYTHONPATH=os.getcwd()), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_streamrl_example_refuses_a_folder_another_user_could_change_and_writes_nothing(tmp_path):
    folder, why = another_users(tmp_path)
    before = fingerprint(tmp_path)
    done = make_example(
        "--policy", str(folder / "policy"), "--data", str(folder / "d.jsonl"), cwd=tmp_path
    )
    refused_line(done, "the folder of model.path (--policy)", why)
    assert fingerprint(tmp_path) == before


def test_streamrl_example_refuses_a_link_planted_at_a_path_and_writes_nothing(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "data.jsonl").symlink_to(victim / "notes.txt")
    before = fingerprint(tmp_path)
    done = make_example(
        "--policy", str(tmp_path / "policy"), "--data", str(tmp_path / "data.jsonl"), cwd=tmp_path
    )
    refused_line(done, "data.path", "symlink")
    assert fingerprint(tmp_path) == before and not (tmp_path / "policy").exists()


def planted(tmp_path: Path, link: str) -> tuple[Path, Path]:
    """A run directory of this user's where ``link`` (a directory the command writes) is a link
    to a victim's directory, whose files must stay as they are."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("the victim's\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    (run_dir / link).symlink_to(victim, target_is_directory=True)
    return run_dir, victim


@pytest.mark.parametrize("name", WRITERS)
def test_a_link_planted_where_a_writer_writes_is_refused_and_nothing_goes_through_it(
    tmp_path, name
):
    run_dir, victim = planted(tmp_path, POLICY[name].link)
    before = fingerprint(tmp_path)
    done = streamrl(name, run_dir, *POLICY[name].args, cwd=tmp_path)
    refused(done, POLICY[name].link, "symlink")
    assert fingerprint(tmp_path) == before


# the commands that find the run's Redis in its redis.url (actors without --join)
URL_READERS = {
    "scale": POLICY["scale"].args,
    "actors": (*CONFIG, "--count", "0"),
    "inspect": CONFIG,
}


@pytest.mark.parametrize("name", sorted(URL_READERS))
def test_a_planted_redis_url_link_is_not_followed_to_another_redis(tmp_path, name):
    """A ``redis.url`` that is a link (to a URL of someone else's Redis) is refused, naming
    run.dir: it would point the command at that Redis (``broker.client.redis_url``)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    (tmp_path / "their.url").write_text(ATTACKER_URL)
    (run_dir / "redis.url").symlink_to(tmp_path / "their.url")
    (run_dir / "scale.key").write_text("00" * 32 + "\n")
    args = URL_READERS[name]
    before = fingerprint(tmp_path)
    done = streamrl(name, run_dir, *args, cwd=tmp_path)
    refused(done, "redis.url", "symlink")
    assert fingerprint(tmp_path) == before


def _others_may_write(path: Path) -> None:
    path.chmod(0o666)


def _another_uids(path: Path) -> None:
    os.chown(path, OTHER_UID, OTHER_UID)


@pytest.mark.parametrize(
    "hand_over",
    [
        pytest.param(
            _another_uids,
            marks=pytest.mark.skipif(os.geteuid() != 0, reason="only root can chown"),
            id="owned-by-another-uid",
        ),
        pytest.param(_others_may_write, id="others-may-write"),
    ],
)
def test_redis_url_trusts_only_a_regular_file_of_this_user_in_a_trusted_dir(tmp_path, hand_over):
    from streamrl.broker.client import RedisNotConfigured, redis_url
    from streamrl.configs.schema import BrokerConfig

    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    url_file = run_dir / "redis.url"
    url_file.write_text("redis://:pw@127.0.0.1:7/0\n")
    url_file.chmod(0o600)
    assert redis_url(BrokerConfig(), run_dir) == "redis://:pw@127.0.0.1:7/0"
    hand_over(url_file)
    with pytest.raises(RedisNotConfigured, match=r"run.dir .*redis.url .*not a file a run"):
        redis_url(BrokerConfig(), run_dir)
    url_file.unlink()
    os.mkfifo(url_file)
    with pytest.raises(RedisNotConfigured, match="not a regular file"):
        redis_url(BrokerConfig(), run_dir)


# ----- what a fresh run directory looks like -----------------------------------------------------


def assert_private(run_dir: Path) -> list[str]:
    """``run_dir`` and every directory under it 0700, no file under it open to group or others
    (0600; 0700 for what is made executable: DeepSpeed's ``zero_to_fp32.py``); returns what is
    there."""
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    seen = []
    for path in sorted(run_dir.rglob("*")):
        if path.is_symlink():
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        if path.is_dir():
            assert mode == 0o700, (path, oct(mode))
        else:
            assert mode & 0o077 == 0 and mode & 0o600 == 0o600, (path, oct(mode))
        seen.append(str(path.relative_to(run_dir)))
    return seen


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.getcwd(), **{PASSWORD_ENV: "pw-of-the-run"})
    env.pop("REDIS_URL", None)
    return env


def _popen(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "streamrl", *args],
        env=_env(), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _started(proc: subprocess.Popen, mark: str) -> str:
    """Lines of ``proc``'s stdout up to one holding ``mark`` (the process is ready then)."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if mark in line:
            return "".join(lines)
    raise AssertionError(f"no {mark!r} line: {''.join(lines)}{proc.stderr.read()}")


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.fixture
def umask_022():
    """The umask a user's shell usually has: what the commands make must not depend on it."""
    before = os.umask(0o022)
    yield
    os.umask(before)


@pytest.mark.timeout(180)
def test_a_fresh_run_dir_of_a_broker_and_of_a_joining_actor_host_is_private(
    tmp_path, demo_policy, demo_dataset, umask_022
):
    # run.dir and the runs/ above it are made by the commands
    runs = tmp_path / "runs"
    broker = _popen("broker", "--config", "demo_cpu", f"run.dir={runs / 'broker'}",
                    "broker.port=0", cwd=tmp_path)  # fmt: skip
    try:
        ready = _started(broker, "other hosts: ")
        join = ready.split("--join ", 1)[1].split()[0]
        actors = _popen(
            "actors", "--config", "demo_cpu", "--join", join, "--count", "0",
            f"run.dir={runs / 'actors'}", f"model.path={demo_policy}",
            f"data.path={demo_dataset}", "run.host_id=hostA", cwd=tmp_path,
        )  # fmt: skip
        try:
            _started(actors, "host hostA: joined run")
            seen = assert_private(runs / "actors")
            assert {"hosts/hostA/config.yaml", "hosts/hostA/scale.key"} <= set(seen), seen
        finally:
            _stop(actors)
        seen = assert_private(runs / "broker")
        assert {"redis.url", "redis/redis.log"} <= set(seen), seen
    finally:
        _stop(broker)
    assert stat.S_IMODE(runs.stat().st_mode) == 0o700


@pytest.mark.timeout(300)
def test_sft_writes_its_checkpoint_and_policy_for_its_user_only(tmp_path, demo_policy, umask_022):
    data = tmp_path / "sft.jsonl"
    rows = [{"prompt": f"{n}>", "completion": str(n)[::-1]} for n in (123, 456, 789, 321)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run_dir = tmp_path / "runs" / "sft"
    sft = subprocess.run(
        [sys.executable, "-m", "streamrl", "sft", "--config", "sft_cpu", f"run.dir={run_dir}",
         f"model.path={demo_policy}", f"supervised.path={data}", "supervised.batch_size=4",
         "run.report_to=[]"],
        env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert sft.returncode == 0, sft.stderr[-3000:]
    seen = assert_private(run_dir)
    # what the finding was about: the checkpoint and the exported policy
    assert any(p.startswith("checkpoints/step-") for p in seen), seen
    assert "policy/model.safetensors" in seen, seen
