"""One exception type for every refusal the user can fix.

A ``SpecserveError`` carries a one-line, human-readable reason.  The command line prints it without
a traceback and the server turns it into a 4xx response; anything else escaping is a bug.
"""


class SpecserveError(ValueError):
    """A configuration or input the user asked for cannot be honoured; the message says why."""
