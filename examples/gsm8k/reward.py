"""GSM8K reward: the completion's final answer against the number after ``####`` in the solution."""

from math_verify import parse, verify


def gsm8k_answer(messages, answer, **_):
    gold = parse(f"${str(answer).split('####')[-1].strip().replace(',', '')}$")
    predicted = parse(messages[-1]["content"])
    return float(bool(gold) and bool(predicted) and verify(gold, predicted))
