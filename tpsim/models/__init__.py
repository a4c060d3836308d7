"""Models built from the layers: the GPT (GPT-2 names) serial and tensor-parallel."""

from tpsim.models.build import build_gpt, parallel_gpt, serial_gpt
from tpsim.models.config import GPTConfig
from tpsim.models.gpt import GPT, Block, DropoutPlan, Transformer

__all__ = ["GPT", "Block", "DropoutPlan", "GPTConfig", "Transformer", "build_gpt", "parallel_gpt", "serial_gpt"]
