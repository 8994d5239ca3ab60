"""Model runtime: configuration, loading, the decoder and its KV cache."""

from specserve.models.config import ModelConfig
from specserve.models.kv_cache import KVCache
from specserve.models.decoder import Decoder, ForwardOutput
from specserve.models.llama import Transformer
from specserve.models.loader import LoadedModel, RuntimeOptions, load_model, resolve_model_path

__all__ = ["Decoder", "ForwardOutput", "KVCache", "LoadedModel", "ModelConfig", "RuntimeOptions", "Transformer",
           "load_model", "resolve_model_path"]
