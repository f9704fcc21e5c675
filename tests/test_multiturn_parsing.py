"""Tool-call parsing is linear in the turn's length: a model turn (or an agent's) cannot stall
the actor's GIL or the agent server's event loop with an unclosed tag."""

from __future__ import annotations

import time

from streamrl.actors.environment import parse_tool_calls, strip_tool_calls

CALL = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'


def _seconds(text: str) -> float:
    """The fastest of 3 parses (and strips) of ``text``: the least disturbed by a loaded CPU."""
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        parse_tool_calls(text)
        strip_tool_calls(text)
        best = min(best, time.perf_counter() - began)
    return best


def _hostile(n: int) -> list[str]:
    """Texts of about ``n`` characters that make a backtracking regex super-linear."""
    opens = "<tool_call>" * (n // len("<tool_call>"))
    return ["<tool_call>" + " " * n, "<tool_call>" + "\n " * (n // 2) + "x", opens]


def test_parsing_is_linear_in_adversarial_text():
    # the regex this replaced took 0.7 s on 1,000 spaces and hours on 100,000
    for n in (1_000, 100_000):
        benign = CALL + "a" * n
        # generous against a same-length linear reference, so a slow CPU cannot flake it
        bound = 0.05 + 50 * _seconds(benign)
        for text in _hostile(n):
            assert _seconds(text) < bound, (n, text[:30])


def test_blocks_match_the_tool_call_format():
    text = f"a {CALL} b <tool_call>\n [1] \n</tool_call> c <tool_call> unclosed"
    assert parse_tool_calls(text) == [
        {"name": "f", "arguments": {}},
        {"error": "expected {name: str, arguments: object}"},
    ]
    assert strip_tool_calls(text) == "a  b  c <tool_call> unclosed"
    # a second opening tag inside a block belongs to it; the first closing tag ends it
    assert strip_tool_calls("<tool_call>x<tool_call>y</tool_call>z") == "z"
