"""The learner's model FLOP utilisation (MFU): the FLOPs its training tokens need over the peak.

Convention (Kaplan et al. 2020, PaLM appendix B, nanoGPT's ``estimate_mfu``): a token trained
costs 2N FLOPs forward and 4N backward, N being the parameters that multiply activations: every
parameter but the input embedding table, whose lookup is no matmul (a tied table counts once, as
the output layer; Qwen2.5-0.5B's 494M are all such). The backward's 4N is 2N for the activation
gradients, through every layer, and 2N for the weight gradients of the trained parameters only,
so a LoRA policy's token costs ~4N. The attention scores' own FLOPs (PaLM's 12·L·H·Q·T) are left
out: plain 6N, as the issue counts, a few percent low at 1-2k-token samples. MFU counts what the
tokens need, not what ran: recomputation (gradient checkpointing, the chunked head) and the
step's no-grad passes (pi_prox, the KL reference) add time but no model FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Dense (no sparsity) bf16 tensor-core peak per GPU, TFLOP/s, from NVIDIA's datasheets (their
# headline figures are with 2:4 sparsity: twice these): H100 SXM 989 / PCIe 756 / NVL 835
# (nvidia.com/en-us/data-center/h100), H200 SXM 989 / NVL 835 (nvidia.com/en-us/data-center/h200),
# A100 312 (A100 datasheet), L40S 362 (L40S datasheet), L40 181 (L40 datasheet), L4 121
# (L4 datasheet), B200 2250 (HGX B200, nvidia.com/en-us/data-center/hgx). Matched as substrings
# of torch.cuda.get_device_name(), first match wins: the longer names come first.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H200 NVL", 835.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
)


def table_peak_tflops(device_name: str) -> float | None:
    """A GPU's dense bf16 peak (TFLOP/s) by its CUDA device name; None when it is not listed."""
    for pattern, tflops in PEAK_BF16_TFLOPS:
        if pattern in device_name:
            return tflops
    return None


def peak_flops(setting: float | None, device_name: str | None, ranks: int) -> float | None:
    """The learner's peak, FLOP/s over its ``ranks`` GPUs: ``setting`` (``learner.peak_tflops``, per
    rank) when set and non-zero, else the table's for ``device_name`` (None on a CPU); None when
    neither knows it."""
    per_rank = setting or (table_peak_tflops(device_name) if device_name else None)
    return per_rank * 1e12 * ranks if per_rank else None


def training_flops_per_token(matmul_params: int, trained_matmul_params: int) -> float:
    """2N forward + 2N activation gradients + 2 x the trained part of N for weight gradients."""
    return 4.0 * matmul_params + 2.0 * trained_matmul_params


def matmul_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(N, the trained part of N): the parameters that multiply activations, all of them and those
    that require grad. The input embedding table is left out unless it is also the output layer."""
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    tied = output is not None and output.weight is embedding
    counted = [p for p in model.parameters() if tied or p is not embedding]
    return sum(p.numel() for p in counted), sum(p.numel() for p in counted if p.requires_grad)


def mfu(tokens: float, seconds: float, flops_per_token: float, peak: float | None) -> float | None:
    """The share of ``peak`` FLOP/s that ``tokens`` trained in ``seconds`` needed; None (unknown,
    not 0) without a peak or a time."""
    if peak is None or seconds <= 0:
        return None
    return tokens * flops_per_token / (seconds * peak)


@dataclass(frozen=True)
class Throughput:
    """What the step row's ``mfu`` divides by: the policy's FLOPs per trained token and the peak of
    the learner's GPUs (None: unknown, the row's mfu stays empty)."""

    flops_per_token: float
    peak: float | None

    @classmethod
    def of(cls, model: torch.nn.Module, setting: float | None, ranks: int) -> Throughput:
        """For ``model`` on this process's device (CUDA: its name picks the table's peak)."""
        device = next(model.parameters()).device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        return cls(
            training_flops_per_token(*matmul_parameters(model)), peak_flops(setting, name, ranks)
        )

    def mfu(self, tokens: float, seconds: float) -> float | None:
        return mfu(tokens, seconds, self.flops_per_token, self.peak)
