"""The one exception type the CLI turns into a one-line message instead of a traceback."""


class GradwireError(Exception):
    """A user-facing error: the message says what was wrong and what is allowed."""
