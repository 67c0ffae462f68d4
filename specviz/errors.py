"""One exception type for every problem a user can cause or fix.

The CLI prints its message as a single line and exits non-zero; the app shows it in the page.
"""


class SpecvizError(Exception):
    """A clear, user-facing error (bad settings, unknown pair, mismatched tokenizers, ...)."""
