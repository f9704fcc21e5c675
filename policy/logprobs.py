"""The one way learner and actors score tokens under a policy: ``sequence_logprobs``.

The learner's loss, its proximal and KL reference passes and the actors' reference pass all call
it, so the log-probs they compare come from the same arithmetic, and the sampler
(``actors.engines.hf.sampling``) truncates with the same ``kept_floor``: a token's log-prob is taken
under the distribution the actors sample from (mu's family, docs/guarantees.md "What mu is"):
logits divided by the temperature, then top-k, then top-p, renormalised over the kept tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

# completion tokens scored at once when the caller names no chunk (the learner passes
# ``learner.logprob_chunk_tokens``): [chunk, vocabulary] float32 logits, 0.6 GB at Qwen's 151,936
DEFAULT_CHUNK_TOKENS = 1024


@dataclass(frozen=True)
class Sampling:
    """The sampling distribution a token is scored under (``rollout.temperature``, ``top_k``,
    ``top_p``; 0 and 1 = off)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def truncates(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0


def as_sampling(sampling: Sampling | float) -> Sampling:
    """A bare number is a temperature with no truncation."""
    return sampling if isinstance(sampling, Sampling) else Sampling(float(sampling))


@torch.no_grad()
def kept_floor(scaled: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """[..., V] tempered logits -> [..., 1] the smallest logit top-k then top-p keep.

    A kept set is always the tokens at or above one logit (top-p keeps a prefix of the sorted
    distribution), so a number per position stands for it: the scorer's recompute in the backward
    pass reuses it instead of sorting the vocabulary again. Ties at the floor are all kept.
    """
    floor = torch.full_like(scaled[..., :1], float("-inf"))
    if 0 < top_k < scaled.shape[-1]:
        floor = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
    if top_p < 1.0:
        ordered = torch.sort(scaled.masked_fill(scaled < floor, float("-inf")), -1, True).values
        probs = torch.softmax(ordered, dim=-1)
        # keep a token while the mass strictly before it is below top_p (the top token always stays)
        kept = ((torch.cumsum(probs, dim=-1) - probs) < top_p).sum(-1, keepdim=True)
        floor = torch.maximum(floor, ordered.gather(-1, kept - 1))
    return floor


def sequence_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sampling: Sampling | float,
    with_entropy: bool = False,
    *,
    position_ids: torch.Tensor | None = None,
    entropy_grad: bool = True,
    keep: torch.Tensor | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    attention_kwargs: dict | None = None,
):
    """log mu_theta(token_{t+1} | prefix) at every position [B, L - 1] of right-padded rows (or at
    the ``keep`` positions), mu_theta being ``sampling``'s distribution over the model's logits.

    ``with_entropy`` also returns the entropy of that distribution at each position; without
    ``entropy_grad`` it is computed outside autograd (for logging). Packed rows (several
    sequences end to end) pass ``position_ids`` restarting at 0 for each sequence and no
    ``attention_mask``: transformers then keeps attention within each sequence.

    ``keep`` (flat indices into ``input_ids``, never a row's last position) scores only those
    positions, [N]. The output layer runs on ``chunk_tokens`` positions at a time, each chunk
    recomputed in the backward pass, so no [positions, vocabulary] tensor exists at once and
    autograd keeps only the hidden states.

    The scored token always counts as kept: a token sampled from another policy's kept set (a
    stale one, or the reference's scores) gets a finite log-prob, the renormalised mass it would
    have had, rather than -inf.

    ``attention_kwargs`` go to every attention layer (``policy.packed_attention``'s sample bounds).
    """
    sampling = as_sampling(sampling)
    dev = next(model.parameters()).device
    head = model.get_output_embeddings()
    hidden: list[torch.Tensor] = []

    def take_hidden(_module, args):
        states = args[0]
        states = states[:, :-1].flatten(0, 1) if keep is None else states.flatten(0, 1)[keep]
        hidden.append(states)
        # the output layer runs below, a chunk at a time
        return (states[:0][None],)

    if keep is not None:
        keep = keep.to(dev)
    hook = head.register_forward_pre_hook(take_hidden)
    try:
        model(
            input_ids=input_ids.to(dev),
            attention_mask=None if attention_mask is None else attention_mask.to(dev),
            position_ids=None if position_ids is None else position_ids.to(dev),
            # a training or scoring pass never decodes on: building a KV cache is wasted work, and
            # transformers ignores packed position ids while a cache is present
            use_cache=False,
            **(attention_kwargs or {}),
        )
    finally:
        hook.remove()
    ids = input_ids.to(dev)
    targets = ids[:, 1:].flatten() if keep is None else ids.flatten()[keep + 1]
    scorer = _ChunkScorer(head, sampling, _softcap(model), with_entropy, entropy_grad)
    outs = scorer(hidden[0], targets, chunk_tokens)
    if keep is None:
        outs = tuple(t.view(ids.shape[0], ids.shape[1] - 1) for t in outs)
    return outs if with_entropy else outs[0]


def _softcap(model) -> float | None:
    """Gemma-style models cap their logits after the output layer, in the forward this bypasses."""
    config = getattr(getattr(model, "module", model), "config", None)
    return getattr(config, "final_logit_softcapping", None)


class _ChunkScorer:
    """The output layer, the truncation and the log-softmax over a chunk of hidden states."""

    def __init__(self, head, sampling: Sampling, softcap, with_entropy: bool, entropy_grad: bool):
        self.head, self.sampling, self.softcap = head, sampling, softcap
        self.with_entropy, self.entropy_grad = with_entropy, entropy_grad
        # chunk start -> its kept floor, computed by the forward and reused by the recompute
        self.floors: dict[int, torch.Tensor] = {}

    def __call__(self, hidden: torch.Tensor, targets: torch.Tensor, chunk_tokens: int):
        recompute = torch.is_grad_enabled() and hidden.requires_grad
        pieces = []
        for start in range(0, max(hidden.shape[0], 1), chunk_tokens):
            args = (
                start,
                hidden[start : start + chunk_tokens],
                targets[start : start + chunk_tokens],
            )
            pieces.append(
                checkpoint(self.chunk, *args, use_reentrant=False, preserve_rng_state=False)
                if recompute
                else self.chunk(*args)
            )
        outs = tuple(torch.cat(column) for column in zip(*pieces, strict=True))
        return outs if self.with_entropy else outs[:1]

    def chunk(self, start: int, hidden: torch.Tensor, targets: torch.Tensor):
        logits = self.head(hidden)
        # half-precision logits are scored in float32; float64 ones (exactness tests) stay float64
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        if self.sampling.temperature != 1.0:
            logits = logits / self.sampling.temperature
        dropped = None
        if self.sampling.truncates:
            floor = self.floors.get(start)
            if floor is None:
                floor = self.floors[start] = kept_floor(
                    logits.detach(), self.sampling.top_k, self.sampling.top_p
                )
            dropped = (logits.detach() < floor).scatter_(-1, targets[:, None], False)
            logits = logits.masked_fill(dropped, float("-inf"))
        log_probs = torch.log_softmax(logits, dim=-1)
        # log mu(y_t) = logit_y - logsumexp(kept logits)
        chosen = torch.gather(log_probs, -1, targets[:, None]).squeeze(-1)
        if not self.with_entropy:
            return (chosen,)
        with torch.set_grad_enabled(self.entropy_grad and torch.is_grad_enabled()):
            # H_t = -sum_v mu(v) log mu(v), dropped tokens adding 0 (not 0 x -inf)
            finite = log_probs if dropped is None else log_probs.masked_fill(dropped, 0.0)
            return chosen, -(log_probs.exp() * finite).sum(-1)
