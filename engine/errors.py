"""The one exception type front ends turn into a one-line message and a non-zero exit."""


class KogError(Exception):
    """A problem the user can act on; its message is a single line, shown without a traceback."""
