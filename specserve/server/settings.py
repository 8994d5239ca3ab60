"""The server's settings, each default defined once: ``ServerSettings``, what ``specserve serve``
runs with (its flags' defaults are these defaults), and ``TokenLimits``, its limits on a request's
tokens.  Both are checked when built, so a setting that cannot work fails with its reason before a
model is loaded.  Nothing here imports FastAPI: the command line reads the defaults when it builds
its parser."""

from __future__ import annotations

from dataclasses import dataclass

from specserve.control.prefill import PrefillPolicy
from specserve.errors import SpecserveError
from specserve.scheduler import MAX_WAITING

DEFAULT_MAX_TOKENS = 256        # tokens generated for a request that names none (within --max-tokens-limit)


@dataclass(frozen=True)
class TokenLimits:
    """The server's limits on a request's tokens (None: only the context length limits them)."""
    max_prompt_tokens: int | None = None
    max_tokens_limit: int | None = None

    def __post_init__(self):
        for name in ("max_prompt_tokens", "max_tokens_limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SpecserveError(f"--{name.replace('_', '-')} must be >= 1, got {value}")

    def check(self, prompt_tokens: int, prompt_field: str, max_tokens: int, max_tokens_field: str) -> None:
        """Raise SpecserveError (its param: the field) for a request past a limit."""
        if self.max_prompt_tokens is not None and prompt_tokens > self.max_prompt_tokens:
            raise SpecserveError(f"{prompt_field}: {prompt_tokens} tokens, more than this server's limit of "
                                 f"{self.max_prompt_tokens} prompt tokens", prompt_field)
        if self.max_tokens_limit is not None and max_tokens > self.max_tokens_limit:
            raise SpecserveError(f"{max_tokens_field}: {max_tokens} tokens asked for, more than this server's "
                                 f"limit of {self.max_tokens_limit}", max_tokens_field)


@dataclass(frozen=True)
class ServerSettings:
    """Everything the server runs with but the model and its runtime.  ``create_app`` reads what
    serving requests needs; ``cmd_serve`` the rest (the address, the engine's batch and prefill,
    the drain)."""
    host: str = "127.0.0.1"                 # address to listen on
    port: int = 8000
    max_batch: int = 16                     # sequences in the running batch (KV rows)
    max_waiting: int = MAX_WAITING          # waiting-queue bound; beyond it: 429
    request_timeout_s: float = 600.0        # seconds before a request gets a 504
    limits: TokenLimits = TokenLimits()
    default_max_tokens: int | None = None   # for a request that names none (None: ``fallback_max_tokens``)
    default_drafter: str | None = None      # for a request that names none (None: the LLM's default)
    max_body_bytes: int = 4 * 2**20         # a larger request body gets a 413
    api_keys: tuple[str, ...] = ()          # bearer tokens /v1 (and /metrics) require; none: no authentication
    metrics_public: bool = False            # /metrics without a key
    request_log: bool = True                # one JSON line per /v1 request on stderr
    prefill: PrefillPolicy = PrefillPolicy(prefix_cache_mb=1024)   # chunked prefill and prefix reuse
    shutdown_timeout_s: float = 30.0        # on SIGTERM: how long running and queued requests may take
    tool_parser: str = "auto"               # the tool-call format (``tools.FORMATS``); auto: the chat template's

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise SpecserveError(f"--port must be in [1, 65535], got {self.port}")
        if self.max_batch < 1:
            raise SpecserveError(f"--max-batch must be >= 1, got {self.max_batch}")
        if self.max_waiting < 0:
            raise SpecserveError(f"--max-waiting must be >= 0, got {self.max_waiting}")
        if not self.shutdown_timeout_s >= 0:
            raise SpecserveError(f"--shutdown-timeout must be >= 0, got {self.shutdown_timeout_s}")
        if self.max_body_bytes < 1:
            raise SpecserveError(f"the body limit must be >= 1 byte, got {self.max_body_bytes}")
        cap = self.limits.max_tokens_limit
        if self.default_max_tokens is not None and cap is not None and self.default_max_tokens > cap:
            raise SpecserveError(f"the default max_tokens ({self.default_max_tokens}) exceeds --max-tokens-limit ({cap})")
        self.prefill.check()
        from specserve.tools import FORMATS
        if self.tool_parser != "auto" and self.tool_parser not in FORMATS:
            raise SpecserveError(f"--tool-parser must be auto or one of {', '.join(sorted(FORMATS))}, "
                                 f"got {self.tool_parser!r}")

    @property
    def fallback_max_tokens(self) -> int:
        """max_tokens of a request that names none: ``default_max_tokens``, else
        ``DEFAULT_MAX_TOKENS`` within ``--max-tokens-limit``."""
        if self.default_max_tokens is not None:
            return self.default_max_tokens
        cap = self.limits.max_tokens_limit
        return DEFAULT_MAX_TOKENS if cap is None else min(DEFAULT_MAX_TOKENS, cap)
