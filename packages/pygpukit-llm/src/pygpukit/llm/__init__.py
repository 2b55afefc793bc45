"""pygpukit.llm: LLM inference on pygpukit (from the pygpukit-llm distribution).

Weights from safetensors and GGUF files (validated as untrusted input), model specs for GPT-2, LLaMA,
Qwen2, Qwen3, Mixtral and Qwen3-MoE, one :class:`CausalTransformerModel` for all of them, HF
tokenizers (also built from GGUF vocabularies), chat templates, and generation with GPU sampling::

    import pygpukit.llm as llm

    model = llm.load("SmolLM2-135M-Instruct.Q4_1.gguf")
    print(model.chat([{"role": "user", "content": "What is the capital of France?"}], temperature=0))
"""

from __future__ import annotations

try:
    from pygpukit._distributions import check_siblings, distribution_version
except ImportError as exc:  # pygpukit-core (which owns pygpukit/__init__.py) is missing
    raise ImportError(
        "pygpukit-llm needs the pygpukit-core distribution, which is not installed: pip install pygpukit-core"
    ) from exc

check_siblings("pygpukit-llm", required=("pygpukit-core", "pygpukit-ops"))

from .chat import ChatMessage, ChatTemplate, ChatTemplateError, split_thinking  # noqa: E402
from .config import (  # noqa: E402
    GPT2_SPEC,
    LLAMA_SPEC,
    MIXTRAL_SPEC,
    MODEL_SPECS,
    QWEN2_SPEC,
    QWEN3_MOE_SPEC,
    QWEN3_SPEC,
    ModelConfigError,
    ModelSpec,
    TransformerConfig,
    config_from_gguf_metadata,
    config_from_hf,
    detect_model_spec,
)
from .decode import DecodeM1, DecodeM1Graph, UnsupportedStrategyError  # noqa: E402
from .decode_batch import DecodeBatch  # noqa: E402
from .decode_spec import DecodeJacobi, DecodeSpeculative  # noqa: E402
from .engine import Engine, EngineMemoryError, EngineStats, Request, RequestSampling  # noqa: E402
from .generation import GenerationStats, SamplingParams, generate, generate_stream  # noqa: E402
from .gguf import GGUFError, GGUFFile, GGUFTensorInfo  # noqa: E402
from .loader import MissingWeightError, load, load_gguf, load_model_from_safetensors  # noqa: E402
from .model import CausalTransformerModel, DecodeState, LayerWeights, ModelWeights  # noqa: E402
from .safetensors import (  # noqa: E402
    SafeTensorsError,
    SafeTensorsFile,
    ShardedSafeTensorsFile,
    TensorInfo,
    load_safetensors,
)
from .shapes import MODEL_SHAPES, random_model  # noqa: E402
from .tokenizer import StreamDecoder, Tokenizer  # noqa: E402

__version__ = distribution_version("pygpukit-llm") or "0+unknown"

__all__ = [
    "GPT2_SPEC",
    "LLAMA_SPEC",
    "MIXTRAL_SPEC",
    "MODEL_SHAPES",
    "MODEL_SPECS",
    "QWEN2_SPEC",
    "QWEN3_MOE_SPEC",
    "QWEN3_SPEC",
    "CausalTransformerModel",
    "ChatMessage",
    "ChatTemplate",
    "ChatTemplateError",
    "DecodeBatch",
    "DecodeJacobi",
    "DecodeM1",
    "DecodeM1Graph",
    "DecodeSpeculative",
    "DecodeState",
    "Engine",
    "EngineMemoryError",
    "EngineStats",
    "GGUFError",
    "GGUFFile",
    "GGUFTensorInfo",
    "GenerationStats",
    "LayerWeights",
    "MissingWeightError",
    "ModelConfigError",
    "ModelSpec",
    "ModelWeights",
    "Request",
    "RequestSampling",
    "SafeTensorsError",
    "SafeTensorsFile",
    "SamplingParams",
    "ShardedSafeTensorsFile",
    "StreamDecoder",
    "TensorInfo",
    "Tokenizer",
    "TransformerConfig",
    "UnsupportedStrategyError",
    "__version__",
    "config_from_gguf_metadata",
    "config_from_hf",
    "detect_model_spec",
    "generate",
    "generate_stream",
    "load",
    "load_gguf",
    "load_model_from_safetensors",
    "load_safetensors",
    "random_model",
    "split_thinking",
]
