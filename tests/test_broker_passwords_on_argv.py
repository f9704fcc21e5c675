"""No role of a run takes a password on its command line (every local user's ``ps`` shows it):
each command that reads a config refuses ``broker.password=`` before it starts anything, with
the same one line naming where the password comes from instead."""

from __future__ import annotations

import pytest

from streamrl.broker.password import PASSWORD_ENV
from streamrl.launch.cli import main

JOIN = ["--join", "redis://127.0.0.1:1/0"]
ROLES = {
    "run": [],
    "broker": [],
    "learner": JOIN,
    "actors": JOIN,
    "scale": [*JOIN, "--actors", "1"],
    "sft": [],
    "dpo": [],
    "export": [],
    "inspect": [],
    "config": ["show"],
}


@pytest.mark.parametrize("role", sorted(ROLES))
def test_every_role_refuses_a_password_override_with_the_same_line(role, tmp_path, capsys):
    argv = [role, *ROLES[role], f"run.dir={tmp_path / 'run'}", "broker.password=hunter2"]
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [
        f"streamrl {role}{' show' if role == 'config' else ''}: broker.password on the command "
        f"line is visible to every local user (ps): set {PASSWORD_ENV} or broker.password_file "
        "instead"
    ]
    assert "hunter2" not in err
    assert not (tmp_path / "run").exists()
