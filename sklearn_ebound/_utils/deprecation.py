"""Keywords renamed before the first release, kept working for one release."""

import warnings

__all__ = ["renamed_keyword"]


def renamed_keyword(old, new, old_value, new_value, *, reason="", stacklevel=2):
    """The value of a keyword renamed ``old`` -> ``new``.

    ``old_value`` (with a :class:`FutureWarning` naming both) when it was given, that is, is not
    ``None``; else ``new_value``. ``stacklevel`` counts from the caller of this function (1),
    so the default points at the code that called the caller.
    """
    if old_value is None:
        return new_value
    warnings.warn(f"`{old}` was renamed `{new}`{f' ({reason})' if reason else ''}; `{old}` will "
                  "be removed in the next release.", FutureWarning, stacklevel=stacklevel + 1)
    return old_value
