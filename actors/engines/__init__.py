"""Generation engines behind one interface (``base.Engine``): ``hf`` everywhere, ``vllm`` on GPUs."""

from streamrl.actors.engines.base import Engine, Output, Request, SamplingParams, WeightSource

__all__ = ["Engine", "Output", "Request", "SamplingParams", "WeightSource"]
