"""One exception type for every refusal the user can fix.

A ``SpecserveError`` carries a one-line, human-readable reason.  The command line prints it without
a traceback and the server turns it into a 4xx response; anything else escaping is a bug.
"""


class SpecserveError(ValueError):
    """A configuration or input the user asked for cannot be honoured; the message says why.

    ``param`` names the offending request field when there is one (``max_tokens``, ``drafter``,
    ``num_draft``, ``prompt``, ``temperature``, ...), so that the server can report it without
    reading the message.
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param
