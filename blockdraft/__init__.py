"""blockdraft: DFlash speculative decoding (block-diffusion drafter + lossless verification) for PyTorch."""
from blockdraft.api import GenerationOutput, Pipeline, TextStream
from blockdraft.decoding.engine import DecodeOptions, SpeculativeEngine
from blockdraft.decoding.sampling import SamplingParams
from blockdraft.decoding.stats import GenerationStats
from blockdraft.errors import BlockdraftError
from blockdraft.modeling.checkpoint import load_drafter, save_drafter
from blockdraft.modeling.config import DrafterConfig, default_target_layer_ids
from blockdraft.modeling.drafter import Drafter
from blockdraft.modeling.target import TargetModel

__version__ = "0.2.0"
__all__ = [
    "BlockdraftError", "DecodeOptions", "Drafter", "DrafterConfig", "GenerationOutput", "GenerationStats",
    "Pipeline", "SamplingParams", "SpeculativeEngine", "TargetModel", "TextStream", "default_target_layer_ids",
    "load_drafter", "save_drafter",
]
