"""blockdraft: DFlash speculative decoding (block-diffusion drafter + lossless verification) for PyTorch."""
from blockdraft.api import GenerationOutput, Pipeline, TextStream
from blockdraft.checkpoint import load_drafter, save_drafter
from blockdraft.config import DrafterConfig, default_target_layer_ids
from blockdraft.drafter import Drafter
from blockdraft.engine import DecodeOptions, SpeculativeEngine
from blockdraft.errors import BlockdraftError
from blockdraft.sampling import SamplingParams
from blockdraft.stats import GenerationStats
from blockdraft.target import TargetModel

__version__ = "0.1.0"
__all__ = [
    "BlockdraftError", "DecodeOptions", "Drafter", "DrafterConfig", "GenerationOutput", "GenerationStats",
    "Pipeline", "SamplingParams", "SpeculativeEngine", "TargetModel", "TextStream", "default_target_layer_ids",
    "load_drafter", "save_drafter",
]
