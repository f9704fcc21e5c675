"""Environments the multi-turn actor test names as ``multiturn_envs:Class`` (tests/ is on its path)."""

from __future__ import annotations

from streamrl.examples.multiturn import SecondAttempt


class Flaky(SecondAttempt):
    """The demo's environment, except that its step raises for answers starting with an even digit."""

    def step(self, turn):
        if int(self.answer[0]) % 2 == 0:
            raise RuntimeError("tool broke")
        return super().step(turn)
