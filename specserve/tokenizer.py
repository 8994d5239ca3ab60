"""Tokenizer and chat template, from transformers.

For a GGUF file transformers rebuilds a fast tokenizer from the file's metadata, which takes
seconds; the result is cached under ``$SPECSERVE_CACHE`` (default ``~/.cache/specserve``) keyed by
the file's path, size and modification time, and reloaded from there afterwards.
"""

from __future__ import annotations

import hashlib
import os
import threading
from functools import lru_cache
from pathlib import Path

from specserve.errors import SpecserveError
from specserve.host import cache_root
from specserve.models.loader import LoadedModel

_lock = threading.Lock()


class Tokenizer:
    def __init__(self, hf, eos_ids: tuple[int, ...]):
        self.hf = hf
        self.eos_ids = frozenset(eos_ids)

    def encode(self, text: str) -> list[int]:
        """Plain completion prompt: the text's tokens (with BOS where the tokenizer adds one)."""
        return list(self.hf(text)["input_ids"])

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Chat prompt: the chat template applied, ending with the assistant's turn opener; ``tools``
        (OpenAI's form) for a template that renders them."""
        if self.hf.chat_template is None:
            raise SpecserveError("this model's tokenizer has no chat template; use a raw prompt")
        text = self.hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    def vocab(self) -> dict[str, int]:
        return self.hf.get_vocab()


def _cache_dir(path: Path) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / "tokenizers" / key


@lru_cache(maxsize=8)
def _load(directory: str, gguf_file: str | None):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if gguf_file is None:
        return AutoTokenizer.from_pretrained(directory)
    cached = _cache_dir(Path(directory) / gguf_file)
    if (cached / "tokenizer_config.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(cached))
        except Exception:  # noqa: BLE001 - a broken cache entry is rebuilt below
            pass
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
    try:
        tok.save_pretrained(str(cached))
    except OSError:
        pass  # a read-only home only costs the rebuild next time
    return tok


def load_tokenizer(model: LoadedModel) -> Tokenizer:
    """The tokenizer belonging to a loaded model (directory or GGUF)."""
    directory, gguf_file = model.tokenizer_source()
    with _lock:
        try:
            hf = _load(directory, gguf_file)
        except Exception as e:  # noqa: BLE001 - surface as one line
            raise SpecserveError(f"cannot load tokenizer from {model.path}: {e}") from None
    eos = set(model.config.eos_token_ids)
    if hf.eos_token_id is not None:
        eos.add(int(hf.eos_token_id))
    return Tokenizer(hf, tuple(sorted(eos)))
