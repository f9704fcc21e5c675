"""The one way learner and actors score tokens under a policy: ``sequence_logprobs``.

The learner's loss, its KL reference pass and the actors' reference pass all call it, so the
log-probs they compare come from the same arithmetic: logits divided by the sampling temperature,
a log-softmax, the sampled token's entry.
"""

from __future__ import annotations

import torch


def sequence_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    temperature: float,
    with_entropy: bool = False,
    *,
    position_ids: torch.Tensor | None = None,
    entropy_grad: bool = True,
    keep: torch.Tensor | None = None,
):
    """log pi(token_{t+1} | prefix) at every position [B, L - 1] of right-padded rows, at ``temperature``
    (or at the ``keep`` positions).

    Actors report log-probs after temperature, so every scorer divides the logits the same way.
    ``with_entropy`` also returns the entropy of that tempered distribution at each position;
    without ``entropy_grad`` it is computed outside autograd (for logging: it then keeps no
    [B, L, vocabulary] activations alive until the backward pass). Packed rows (several
    sequences end to end) pass ``position_ids`` restarting at 0 for each sequence and no
    ``attention_mask``: transformers then keeps attention within each sequence.

    ``keep`` (flat indices into ``input_ids``, never a row's last position) scores only those
    positions, [N]: the output layer runs on them alone, so the other positions' [vocabulary]
    logits are never computed nor kept for the backward pass.
    """
    dev = next(model.parameters()).device
    head = None
    if keep is not None:
        keep = keep.to(dev)
        head = model.get_output_embeddings().register_forward_pre_hook(
            lambda _module, args: (args[0].flatten(0, 1)[keep][None],)
        )
    try:
        logits = model(
            input_ids=input_ids.to(dev),
            attention_mask=None if attention_mask is None else attention_mask.to(dev),
            position_ids=None if position_ids is None else position_ids.to(dev),
            # a training or scoring pass never decodes on: building a KV cache is wasted work, and
            # transformers ignores packed position ids while a cache is present
            use_cache=False,
        ).logits
    finally:
        if head is not None:
            head.remove()
    if keep is None:
        logits, targets = logits[:, :-1], input_ids[:, 1:].to(dev)
    else:
        logits, targets = logits[0], input_ids.to(dev).flatten()[keep + 1]
    # half-precision logits are scored in float32; float64 ones (exactness tests) stay float64
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    # log pi(y_t) = logit_y - logsumexp(logits)
    chosen = torch.gather(log_probs, -1, targets[..., None]).squeeze(-1)
    if not with_entropy:
        return chosen
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        # H_t = -sum_v pi(v) log pi(v)
        return chosen, -(log_probs.exp() * log_probs).sum(-1)
