"""Held-out text for the decoder benchmarks: sentences that no step of a run saw.

``modules``: docstrings of ``HELD_OUT_MODULES`` (another subject); ``manual``: every fourth
sentence of the Python reference manual (:func:`manual_sentences`); ``readmes``: every third
prose sentence of the installed distributions' descriptions (their ``METADATA``, in the order
of their names: another register, which depends on what is installed). A held-out sentence
that is also a calibration line (classes of both module sets inherit a docstring or two) is
dropped.
"""

KINDS = ("modules", "manual", "readmes")


def held_out_sentences(kind, calibration=()):
    """The held-out sentences of ``kind``, spread over their topics by a stride, less any
    that is a calibration line."""
    seen = set(calibration)
    return [s for s in _sentences(kind) if s not in seen]


def _sentences(kind):
    from sklearn_ebound.heads import HELD_OUT_MODULES, docstring_sentences, manual_sentences

    if kind == "modules":
        return docstring_sentences(HELD_OUT_MODULES)
    if kind == "manual":
        return manual_sentences()[::4]
    if kind != "readmes":
        raise ValueError(f"`kind` must be one of {KINDS}, got {kind!r}")
    import importlib.metadata

    from sklearn_ebound.heads._text import _prose_sentences

    seen, sentences = set(), []
    for dist in sorted(importlib.metadata.distributions(),
                       key=lambda d: d.metadata["Name"].lower()):
        text = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        sentences.extend(_prose_sentences(text, seen, 6, 40, strict=True))
    return sentences[::3]
