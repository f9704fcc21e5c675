"""How far a float32 evaluation of a model may stray from exact, derived from the evaluation at hand.

Two float32 evaluations of one network (an engine's and the learner's) differ by rounding, and by
how much depends on the CPU's kernels (their blocking, so their summation order) and on how large
the activations are. A fixed atol holds on one machine and flakes on another. So a check computes
the learner's log-probs twice, in float32 and in float64, and allows the engine ``SAFETY`` times the
learner's own float32 error against float64, over all the tokens checked together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from streamrl.learner.engine import token_logprobs
from streamrl.policy.logprobs import Sampling

# Measured on the demo policy (the vLLM engine, LoRA and multi-turn tests, 190 checks): vLLM's
# worst token strayed up to 3.8x as far as the learner's worst. The tolerances this gives there
# are 1e-4 to 2e-3; another weight version moved log-probs by 2 to 3.6 (the LoRA test) and a
# temperature 2 % off by 1.5e-2 to 6.7e-2 (the hf engine).
SAFETY = 32
# the learner's float32 evaluation may land close to float64 by luck: never allow less than a few
# float32 ulps of the largest value
FLOOR_ULPS = 8


def rounding_tolerance(float32: np.ndarray, float64: np.ndarray) -> float:
    """The atol for another float32 evaluation of what ``float32`` and ``float64`` evaluated."""
    float32, float64 = np.asarray(float32, np.float64), np.asarray(float64, np.float64)
    error = float(np.abs(float32 - float64).max(initial=0.0))
    floor = (
        FLOOR_ULPS
        * float(np.finfo(np.float32).eps)
        * max(1.0, float(np.abs(float64).max(initial=0.0)))
    )
    return SAFETY * max(error, floor)


def assert_within_rounding(actual, float32, float64, err_msg: str = "") -> None:
    """``actual`` (another float32 evaluation) equals float64 up to the rounding float32 shows here."""
    np.testing.assert_allclose(
        np.asarray(actual, np.float64),
        np.asarray(float64, np.float64),
        atol=rounding_tolerance(float32, float64),
        rtol=0,
        err_msg=err_msg,
    )


def parameters_from(weights: dict[str, torch.Tensor]) -> Callable[[torch.nn.Module], None]:
    """A ``load`` for ``learner_logprobs_twice``: copies ``weights`` into a model's parameters by
    name, converting to the model's dtype."""

    def load(model: torch.nn.Module) -> None:
        for name, param in model.named_parameters():
            param.copy_(weights[name])

    return load


def learner_logprobs_twice(
    models: Sequence[torch.nn.Module],
    load: Callable[[torch.nn.Module], None],
    batch,
    temperature: Sampling | float,
) -> tuple[np.ndarray, np.ndarray]:
    """The learner's log-probs of ``batch``'s completion tokens by the float32 and the float64 copy
    of one policy (``models``), once ``load`` put the weights under test into each."""
    evaluated = []
    with torch.no_grad():
        for model in models:
            load(model)
            logprobs = token_logprobs(model, batch, temperature)
            evaluated.append(logprobs[batch.completion_mask].numpy())
    float32, float64 = evaluated
    return float32, float64
