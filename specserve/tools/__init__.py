"""Tool calling: the tools a request offers, the call formats of the model families (each read back
from text and enforced by a grammar), prompts that show the tools, and the calls of a reply."""

from specserve.tools import formats as _formats  # noqa: F401 - registers the formats
from specserve.tools.base import FORMATS, CallFormat, call_format
from specserve.tools.reader import CallStream, Reading, calls_of, read
from specserve.tools.spec import Call, Tool, ToolChoice, tools_of

__all__ = ["FORMATS", "Call", "CallFormat", "CallStream", "Reading", "Tool", "ToolChoice", "call_format", "calls_of",
           "read", "tools_of"]
