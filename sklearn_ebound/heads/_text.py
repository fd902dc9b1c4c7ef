"""Real English that ships with Python: sentences of the standard library's docstrings.

Tests, examples and benchmarks of the pretrained heads need real text with no download. The
docstrings of the standard library are written English prose; :func:`docstring_sentences`
cuts them into sentences and keeps those that read as prose (no code, no doctest lines).
:func:`manual_sentences` does the same for the Python reference manual's topics that
``help()`` shows: prose of another register, to check that what a plan learnt from
docstrings holds on text of another kind.
"""

import importlib
import inspect
import re
import warnings

__all__ = ["docstring_sentences", "manual_sentences", "CALIBRATION_MODULES",
           "HELD_OUT_MODULES", "WIDE_CALIBRATION_MODULES"]

# Two disjoint sets of modules: text to calibrate on, and other text to check on.
CALIBRATION_MODULES = ("argparse", "collections", "json", "logging", "pathlib", "subprocess",
                       "textwrap", "unittest", "difflib", "inspect", "typing", "threading")
HELD_OUT_MODULES = ("email.message", "http.client", "tarfile", "zipfile", "shutil", "random",
                    "datetime", "decimal", "fractions", "heapq", "calendar", "configparser")
# More topics to calibrate on, still disjoint from the held-out modules (and from their
# subjects: no other HTTP, mail, archive, compression, date or number module).
WIDE_CALIBRATION_MODULES = CALIBRATION_MODULES + (
    "os", "socket", "itertools", "io", "ssl", "xml.etree.ElementTree", "dataclasses",
    "contextlib", "abc", "queue", "sched", "optparse", "pdb", "pydoc", "doctest", "locale",
    "codecs", "sysconfig", "pkgutil", "ast", "dis", "tokenize", "traceback", "weakref",
    "shelve", "tempfile", "base64", "ipaddress", "platform", "plistlib", "webbrowser",
    "socketserver", "xmlrpc.client", "getpass", "mimetypes", "fnmatch", "getopt")

_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_CODE = re.compile(r"[=<>{}\[\]\\|@#$`~^*_]|\(\)|::|>>>|\.\.\.|\w\.\w")
# Stricter for text that is not a docstring: no links, no parentheses, no colons (the
# manual's and the package descriptions' prose breaks into code and lists at these).
_NOT_PROSE = re.compile(r"https?:|www\.|[():]")


def _prose_sentences(text, seen, min_words, max_words, strict=False):
    """The sentences of ``text`` that read as prose and are not in ``seen`` (which grows)."""
    for paragraph in re.split(r"\n\s*\n", text or ""):
        for sentence in _SPLIT.split(" ".join(paragraph.split())):
            words = sentence.split()
            if not (min_words <= len(words) <= max_words) or sentence in seen:
                continue
            if not sentence[0].isupper() or sentence[-1] not in ".!?":
                continue
            if _CODE.search(sentence) or (strict and _NOT_PROSE.search(sentence)):
                continue
            seen.add(sentence)
            yield sentence


def _docstrings(module):
    """The module's docstring, then those of its public functions, classes and methods."""
    yield inspect.getdoc(module)
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj) or inspect.isclass(obj):
            yield inspect.getdoc(obj)
        if inspect.isclass(obj):
            for attr, member in sorted(vars(obj).items()):
                if not attr.startswith("_") and inspect.isfunction(member):
                    yield inspect.getdoc(member)


def docstring_sentences(modules=CALIBRATION_MODULES, *, min_words=6, max_words=40):
    """Prose sentences of the docstrings of standard-library modules, in a fixed order.

    Each docstring is split into paragraphs, the paragraphs into sentences; a sentence is kept
    when it has ``min_words`` to ``max_words`` words, starts with a capital letter, ends with
    a full stop (or ``?``/``!``) and holds no code-like characters. Duplicates are dropped.

    Parameters
    ----------
    modules : sequence of str, default=CALIBRATION_MODULES
        Names of importable modules; :data:`HELD_OUT_MODULES` is a disjoint second set.
    min_words, max_words : int, default=6, 40
        Length limits of a kept sentence.

    Returns
    -------
    sentences : list of str

    Examples
    --------
    >>> from sklearn_ebound.heads import docstring_sentences
    >>> sentences = docstring_sentences(["textwrap"])
    >>> len(sentences) > 5 and all(s[0].isupper() for s in sentences)
    True
    """
    seen, sentences = set(), []
    for name in modules:
        module = importlib.import_module(name)
        with warnings.catch_warnings():
            # reading attributes of some modules (typing.io) warns that they are deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            docs = list(_docstrings(module))
        for doc in docs:
            sentences.extend(_prose_sentences(doc, seen, min_words, max_words))
    return sentences


def manual_sentences(*, min_words=6, max_words=40):
    """Prose sentences of the Python reference manual's topics, in a fixed order.

    The topics are those ``help()`` shows (``pydoc_data.topics``: the language reference's
    sections on statements, expressions, types and the data model), taken in the order of
    their names. The filter is :func:`docstring_sentences`'s, stricter: no sentence with a
    link, a parenthesis or a colon, where the manual's prose turns into grammar and code.

    Parameters
    ----------
    min_words, max_words : int, default=6, 40
        Length limits of a kept sentence.

    Returns
    -------
    sentences : list of str

    Examples
    --------
    >>> from sklearn_ebound.heads import manual_sentences
    >>> sentences = manual_sentences()
    >>> len(sentences) > 100 and all(":" not in s for s in sentences)
    True
    """
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:  # some distributions ship Python without it
        raise ImportError("manual_sentences needs the standard library's pydoc_data "
                          "package, which this Python does not have.") from exc
    seen, sentences = set(), []
    for name in sorted(topics):
        sentences.extend(_prose_sentences(topics[name], seen, min_words, max_words,
                                          strict=True))
    return sentences
