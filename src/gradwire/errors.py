"""The one exception type the CLI turns into a one-line message instead of a traceback."""


class GradwireError(Exception):
    """A user-facing error: the message says what was wrong and what is allowed."""


def did_you_mean(name: object, known: object) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known`` to ``name``, or ``""``."""
    import difflib

    hint = difflib.get_close_matches(str(name), [str(k) for k in known], n=1)
    return f" (did you mean {hint[0]!r}?)" if hint else ""
