"""The documented multi-host commands, run verbatim on three hosts that share only a network and
the learner nodes' run.dir (tests/netns_hosts.py):

- the README's multi-host block and docs/multihost.md's are the same lines; the test runs them as
  printed, with only the placeholders filled: ``/shared/run`` becomes a folder mounted at that
  path on A and B (C's run.dir is its own), the password line runs once and its value is in
  every host's environment; nothing is added to any command;
- A resolves its own name to 127.0.1.1 (Debian's /etc/hosts); B and C resolve A to 10.77.0.1;
- every host has its own /dev/shm, /tmp and working directory, where the block's first line
  (``ABC$ streamrl example $SET``: a line for several hosts runs on each, to its end, before the
  next line) makes the demo's policy and prompts (deterministic: the same on every host).

The run ends at the demo's target or when the test stops it (SIGTERM to every command, as a
user would), so the checks that need it alive come first and wait on events: C's actors apply
versions read from C's relay segment (their heartbeat's ``weights_from``), C's link carries about
one model per version (the veth's counter over the versions C's relay received), a SIGKILLed
actor on C comes back and catches up, C unplugged past ``weightsync.timeout_s`` does not stop the learner
and trains again once plugged back; no process on C opens or maps A's segment; every host's logs
and every command's output are free of tracebacks and errors.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from netns_hosts import Host, available, hosts
from user_project import IMPORTED, ROOT, user_project

from streamrl.launch.status import read_steps

DOCS = (ROOT / "README.md", ROOT / "docs" / "multihost.md")
# the placeholder of the learner nodes' shared run.dir in the documented commands
SHARED_RUN = "/shared/run"
# versions over which C's link is measured (counted from C's actors' heartbeats)
LINK_VERSIONS = 12
# what the run's actors, relays and learners may log without anything having gone wrong
EXPECTED = ()
TROUBLE = re.compile(r"Traceback \(most recent call last\)|\bERROR\b|\bCRITICAL\b|\bFATAL\b")

why_not = available()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        why_not is not None and not os.environ.get("STREAMRL_REQUIRE_NETNS"),
        reason=f"several hosts need network namespaces: {why_not}",
    ),
]


class RunEnded(Exception):
    """The learners stopped by themselves (the demo reached its target)."""


def documented_block(path: Path) -> list[str]:
    """The fenced block of ``path`` that starts ``streamrl broker``: its lines, as printed."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", path.read_text(), re.M | re.S)
    found = [b for b in blocks if "streamrl broker" in b and "--join" in b]
    assert len(found) == 1, f"{path}: {len(found)} multi-host blocks"
    return found[0].strip("\n").splitlines()


def test_the_readme_and_the_multihost_doc_show_the_same_commands():
    readme, doc = (documented_block(p) for p in DOCS)
    assert readme == doc


class Commands:
    """The documented block, parsed: the password line, the ``SET=`` line, ``host$ command``s."""

    def __init__(self, lines: list[str], run_dir: Path):
        self.password_cmd = self.set_line = ""
        self.steps: list[tuple[str, str]] = []
        for line in lines:
            if line.startswith("export STREAMRL_REDIS_PASSWORD="):
                self.password_cmd = re.fullmatch(r"[^$]*\$\((.*)\)\s*", line.split("#")[0])[1]
            elif line.startswith("SET="):
                self.set_line = line.replace(SHARED_RUN, str(run_dir))
            elif re.match(r"^[A-Z]+\$ ", line):
                names, _, command = line.partition("$ ")
                self.steps.append((names, command))
        assert self.password_cmd and self.set_line and self.steps, lines

    def script(self, command: str) -> list[str]:
        """What a user types on the host, in a shell: the SET line, then the command."""
        return ["bash", "-c", f"{self.set_line}\nexec {command}"]


class Probe:
    """tests/multihost_probe.py on host A: the run's Redis state as a dict, on demand."""

    def __init__(self, host: Host, env: dict, run_name: str, url: str):
        self.proc = host.popen(
            [sys.executable, "-u", str(ROOT / "tests" / "multihost_probe.py"), run_name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=host.own,
            env={**env, "REDIS_URL": url},
        )  # fmt: skip

    def __call__(self) -> dict:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        assert "error" not in out, out
        return out


class Run:
    """The documented commands running on the hosts, and what the test asks of them."""

    def __init__(self, h: dict[str, Host], tmp_path: Path, run_dir: Path):
        self.h, self.tmp_path, self.run_dir = h, tmp_path, run_dir
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.outputs: list[Path] = []

    def start(self, name: str, cmds: Commands, command: str, env: dict, cwd: Path) -> None:
        out = self.tmp_path / f"{len(self.procs)}-{name}$.log"
        self.outputs.append(out)
        proc = self.h[name].popen(cmds.script(command), cwd=cwd, env=env, stdout=open(out, "w"),
                                  stderr=subprocess.STDOUT)  # fmt: skip
        self.procs.append((f"{name}$ {command}", proc))

    def learners(self) -> list[subprocess.Popen]:
        return [p for what, p in self.procs if "streamrl learner" in what]

    def wait(self, what: str, ok, timeout: float) -> None:
        """Poll ``ok`` until true (a hang guard, not a speed bound); RunEnded if the learners
        stopped by themselves; fail if any other command exited."""
        deadline = time.monotonic() + timeout
        while not ok():
            learners = self.learners()
            if learners and all(p.poll() == 0 for p in learners):
                raise RunEnded(what)
            for name, proc in self.procs:
                assert proc.poll() is None, (
                    f"`{name}` exited ({proc.returncode}) waiting for {what}"
                )
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.5)

    def stop(self) -> None:
        """SIGTERM every command, as a user would: the broker last, once the others are gone."""
        for group in (self.procs[1:], self.procs[:1]):
            for _, proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for name, proc in group:
                try:
                    proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    raise AssertionError(f"`{name}` still running 90 s after SIGTERM") from None

    def logs(self) -> dict[str, str]:
        """Every command's output and every host's files under run.dir/hosts, by name."""
        texts = {p.name: p.read_text(errors="replace") for p in self.outputs}
        folders = [self.run_dir / "hosts", self.h["C"].path(self.run_dir / "hosts")]
        for folder in folders:
            for path in sorted(folder.glob("*/logs/**/*")) if folder.exists() else ():
                if path.is_file():
                    texts[str(path.relative_to(folder))] = path.read_text(errors="replace")
        return texts


def _pids(host: Host, needle: str) -> list[int]:
    """Processes on ``host`` whose command line contains ``needle``."""
    found = []
    for pid in host.pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmdline:
            found.append(pid)
    return found


def _opened(host: Host) -> str:
    """What every process on ``host`` has mapped or open: its maps and its fds' targets."""
    seen = []
    for pid in host.pids():
        try:
            seen.append(Path(f"/proc/{pid}/maps").read_text())
            fds = Path(f"/proc/{pid}/fd")
            seen += [os.readlink(fd) for fd in fds.iterdir()]
        except OSError:  # a process that exited meanwhile
            continue
    return "\n".join(seen)


def _writer_pid(segment: str) -> int:
    """The pid in a segment's name (``streamrl.<run>.weights.<host>.<pid>.<hex>``)."""
    return int(segment.rsplit(".", 2)[-2])


def _tensor_bytes(safetensors: Path) -> int:
    """One model: the tensors' bytes in a safetensors file (its size less its JSON header)."""
    with open(safetensors, "rb") as f:
        header = int.from_bytes(f.read(8), "little")
    return safetensors.stat().st_size - 8 - header


def _c_actors(snap: dict) -> dict[str, dict]:
    return {name: a for name, a in snap["actors"].items() if name.startswith("C-")}


def _check_provenance(snap: dict, h: dict[str, Host], prefix: str) -> str:
    """C's actors read C's relay segment (in C's /dev/shm), A's actor the learner's (in A's);
    returns A's segment's name."""
    c, a = h["C"], h["A"]
    relays = _pids(c, "streamrl.weightsync.relay")
    assert len(relays) == 1, f"C runs {len(relays)} relays"
    for name, actor in _c_actors(snap).items():
        segment = actor["weights_from"]
        assert segment.startswith(prefix + "C."), f"{name} read weights from {segment!r}"
        assert _writer_pid(segment) == relays[0], f"{name}'s segment is not C's relay's: {segment}"
        assert (c.path("/dev/shm") / segment).exists() and not (
            a.path("/dev/shm") / segment
        ).exists()
    a_segment = snap["actors"]["A-a0"]["weights_from"]
    assert a_segment.startswith(prefix + "A."), a_segment
    assert _writer_pid(a_segment) in _pids(a, "streamrl"), "A's segment is not a process of A's"
    assert (a.path("/dev/shm") / a_segment).exists()
    return a_segment


def _relayed(snap: dict) -> int:
    """How many versions C's relay has received and served."""
    return snap["relay"].get("C:versions", 0)


def _at_next_version(run: Run, probe: Probe, host: Host) -> tuple[int, int]:
    """(versions C's relay has received, C's rx bytes), sampled once the count has moved and with
    the count the same just before and just after the rx read: at that moment the link had carried
    exactly that many versions plus part of the next. (A relay that finds two versions waiting
    takes the newest, so the learner's or the actors' versions would overcount.)"""
    start = _relayed(probe())
    seen: list[int] = []

    def moved() -> bool:
        before = _relayed(probe())
        rx = host.rx_bytes()
        seen[:] = [before, rx]
        return _relayed(probe()) == before > start

    run.wait("C's relay on a newer version", moved, 120)
    return seen[0], seen[1]


@pytest.mark.timeout(900)
def test_the_documented_commands_train_on_three_hosts_with_c_fed_by_its_own_relay(tmp_path):
    if why_not is not None:  # STREAMRL_REQUIRE_NETNS (CI) makes a missing capability a failure
        pytest.fail(f"several hosts need network namespaces: {why_not}")
    run_dir = tmp_path / "shared" / "run"
    run_dir.mkdir(parents=True)
    cmds = Commands(documented_block(DOCS[1]), run_dir)
    with hosts(tmp_path / "hosts", shared={run_dir: ("A", "B")}, debian=("A",)) as h:
        run = Run(h, tmp_path, run_dir)
        projects = {name: user_project(host.own) for name, host in h.items()}
        password = h["A"].run(["sh", "-c", f'printf %s "$({cmds.password_cmd})"'],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert len(password) >= 32
        path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"

        def env(name: str) -> dict:
            return {**projects[name][1], "PATH": path, "STREAMRL_REDIS_PASSWORD": password}

        # a line for several hosts runs on each, side by side, to its end
        prepare = [(names, command) for names, command in cmds.steps if len(names) > 1]
        for names, command in prepare:
            done = [
                (n, h[n].popen(cmds.script(command), cwd=projects[n][0], env=env(n),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                for n in names
            ]  # fmt: skip
            for n, proc in done:
                out = proc.communicate(timeout=300)[0]
                assert proc.returncode == 0, f"{n}$ {command}:\n{out[-3000:]}"
        broker, rest = cmds.steps[len(prepare)], cmds.steps[len(prepare) + 1 :]
        assert "streamrl broker" in broker[1]
        join = re.search(r"--join (redis://\S+)", rest[0][1])[1]
        url = join.replace("redis://", f"redis://:{password}@")
        run.start(broker[0], cmds, broker[1], env(broker[0]), projects[broker[0]][0])
        probe = Probe(h["A"], projects["A"][1], "demo", url)
        run.wait("the broker at the documented --join URL", lambda: _answers(probe), 120)
        for name, command in rest:
            run.start(name, cmds, command, env(name), projects[name][0])
        try:
            _scenario(run, probe, h)
        except AssertionError as exc:
            logs = "".join(f"\n--- {k}\n{v[-3000:]}" for k, v in run.logs().items())
            raise AssertionError(f"{exc}\n{logs}") from None
        finally:
            run.stop()
        texts = run.logs()
    rows = read_steps(run_dir)
    actors = {a for r in rows for a in r["groups_by_actor"]}
    assert {"A-a0", "C-a0", "C-a1"} <= actors, actors
    for name, text in texts.items():
        assert IMPORTED not in text, name
        lines = text.splitlines()
        trouble = [i for i, ln in enumerate(lines) if TROUBLE.search(ln)]
        trouble = [i for i in trouble if not any(e in lines[i] for e in EXPECTED)]
        # the first one whole (a traceback's frames follow its first line): the logs live in
        # the hosts' private folders, gone once the test ends
        assert not trouble, f"{name}:\n" + "\n".join(lines[trouble[0] : trouble[0] + 40])


def _answers(probe: Probe) -> bool:
    try:
        probe()
    except (AssertionError, ValueError):
        return False
    return True


def _scenario(run: Run, probe: Probe, h: dict[str, Host]) -> None:
    """The checks that need the run alive, in order; the later ones may meet the demo's end."""
    from streamrl.weightsync.transports.shm.segment import segment_prefix

    a, c = h["A"], h["C"]
    prefix = segment_prefix("demo")

    # 1. provenance: C's actors apply versions read from C's relay segment, nothing on C opens A's
    def fed() -> bool:
        snap = probe()
        mine = _c_actors(snap)
        return (
            len(mine) == 2
            and all(x["version"] >= 2 and x["weights_from"] for x in mine.values())
            and snap["actors"].get("A-a0", {}).get("weights_from", "") != ""
        )

    run.wait("C's actors and A's on weights from a segment", fed, 600)
    a_segment = _check_provenance(probe(), h, prefix)
    opened = _opened(c)
    assert a_segment not in opened and prefix + "A." not in opened, "a process on C opened A's"
    assert prefix + "C." in opened
    try:
        # 2. C's link carries one model per version, however many actors C runs
        model = _tensor_bytes(a.own / "my_project" / "runs" / "demo-policy" / "model.safetensors")
        v0, rx0 = _at_next_version(run, probe, c)
        run.wait(f"{LINK_VERSIONS} more versions on C",
                 lambda: _relayed(probe()) >= v0 + LINK_VERSIONS - 1, 300)  # fmt: skip
        v1, rx1 = _at_next_version(run, probe, c)
        # At each sample the link had carried the counted versions plus anywhere from none to
        # nearly all of the next: the bytes between the samples are n models give or take one,
        # plus headers (~0.5%). Two actors each fetching their own copy would be 2n.
        n, models = v1 - v0, (rx1 - rx0) / model
        assert n - 1 <= models <= 1.25 * (n + 1) < 2 * n, (models, n)
        _check_provenance(probe(), h, prefix)

        # 3. a SIGKILLed actor on C is restarted by C's supervisor and catches up from C's relay
        killed = probe()
        victim = killed["actors"]["C-a0"]["pid"]
        os.kill(victim, signal.SIGKILL)

        def restarted_and_current() -> bool:
            me = probe()["actors"].get("C-a0", {})
            return me.get("pid", victim) != victim and me["version"] > killed["version"]

        run.wait("C-a0 restarted on a newer version", restarted_and_current, 300)
        _check_provenance(probe(), h, prefix)

        # 4. C unplugged past weightsync.timeout_s: the learner trains on A's actor meanwhile
        c.link(False)
        cut_at = len(read_steps(run.run_dir))
        run.wait("steps while C is cut off",
                 lambda: len(read_steps(run.run_dir)) >= cut_at + 3, 300)  # fmt: skip
        c.link(True)
        back_at = len(read_steps(run.run_dir))
        run.wait("C's actors training again after the cut",
                 lambda: any(x.startswith("C-") for r in read_steps(run.run_dir)[back_at:]
                             for x in r["groups_by_actor"]), 300)  # fmt: skip
        _check_provenance(probe(), h, prefix)
        assert prefix + "A." not in _opened(c)
    except RunEnded as ended:
        warnings.warn(f"the demo reached its target before: {ended}", stacklevel=1)
    finally:
        c.link(True)
