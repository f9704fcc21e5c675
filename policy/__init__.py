"""policy: the model learner and actors both run, and what they must agree on about it.

Owns loading a policy folder or hub id and its tokenizer (``load``: the one loader, so both
sides see the same module names and dtype), scoring tokens under a policy (``logprobs``: the
learner's loss, its KL reference and the actors' reference pass use the same arithmetic), the
attention over packed rows without a 4D mask (``packed_attention``: a transformers attention
function the learner switches an sdpa policy to) and LoRA (``lora``: peft wrapping, what a
version publishes, the adapters-off reference, the merged export, a vLLM actor's adapter
versions).

Talks to: nothing at run time (files and the Hugging Face hub cache only).
May import: ``configs``. Must not import ``actors``, ``broker``, ``learner`` or ``weightsync``.
"""
