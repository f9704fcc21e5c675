"""/dev/shm is shared with every local user: segment names cannot be guessed, segments are 0600 and
created exclusively, and a file another user planted under the run's prefix is neither removed nor
able to stop the learner, nor read as weights by an actor."""

from __future__ import annotations

import os
import stat
import subprocess
import uuid

import pytest
from accounts import system_user_uid

from streamrl.weightsync.layout import Layout, TensorSpec
from streamrl.weightsync.transports.shm.segment import SHM_DIR, segment_name, segment_prefix
from streamrl.weightsync.transports.shm.slots import ShmReader, ShmWriter

OTHER_USER = "streamrl-shm-test"
LAYOUT = Layout.build([TensorSpec("w", (16,), "float32")])


def _other_uid() -> int:
    return system_user_uid(OTHER_USER)


def _planted(name: str) -> str:
    """A file of another user in /dev/shm (made by that user, as an attacker would)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a file as another user")
    uid = _other_uid()
    path = SHM_DIR / name

    def as_other() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    subprocess.run(
        ["python3", "-c", f"open({str(path)!r}, 'wb').write(b'x' * 8192)"],
        check=True,
        preexec_fn=as_other,
        cwd="/",
    )
    return str(path)


def test_segment_names_are_unguessable_and_segments_private():
    run = f"shm-{uuid.uuid4().hex[:8]}"
    a, b = ShmWriter(run, LAYOUT, 2, 1.0), ShmWriter(run, LAYOUT, 2, 1.0)
    try:
        secret_a, secret_b = a.name.rsplit(".", 1)[1], b.name.rsplit(".", 1)[1]
        assert len(secret_a) == 32 and secret_a != secret_b
        assert stat.S_IMODE(os.stat(a.path).st_mode) == 0o600
    finally:
        a.close()
        b.close()


def test_another_users_file_under_the_prefix_does_not_stop_the_learner():
    run = f"shm-{uuid.uuid4().hex[:8]}"
    # "dead" pid: the old cleanup took this for a stale segment of a SIGKILLed learner.
    planted = _planted(f"{segment_prefix(run)}999999999.deadbeef")
    try:
        writer = ShmWriter(run, LAYOUT, 2, 1.0)
        writer.close()
        assert os.path.exists(planted), "another user's file was removed"
    finally:
        os.unlink(planted)


def test_an_actor_refuses_a_segment_that_is_not_its_users():
    # a name of the writer's form (any other is refused before anything is opened)
    planted = _planted(segment_name(f"forged-{uuid.uuid4().hex[:8]}", "", 1, uuid.uuid4().hex))
    try:
        with pytest.raises(ValueError, match="not a file of this user"):
            ShmReader(os.path.basename(planted), 1.0)
    finally:
        os.unlink(planted)
