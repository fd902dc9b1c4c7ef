"""Real English that ships with Python: sentences of the standard library's docstrings.

Tests, examples and benchmarks of the pretrained heads need real text with no download. The
docstrings of the standard library are written English prose; :func:`docstring_sentences`
cuts them into sentences and keeps those that read as prose (no code, no doctest lines).
"""

import importlib
import inspect
import re
import warnings

__all__ = ["docstring_sentences", "CALIBRATION_MODULES", "HELD_OUT_MODULES",
           "WIDE_CALIBRATION_MODULES"]

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
            for paragraph in re.split(r"\n\s*\n", doc or ""):
                text = " ".join(paragraph.split())
                for sentence in _SPLIT.split(text):
                    words = sentence.split()
                    if not (min_words <= len(words) <= max_words) or sentence in seen:
                        continue
                    if not sentence[0].isupper() or sentence[-1] not in ".!?":
                        continue
                    if _CODE.search(sentence):
                        continue
                    seen.add(sentence)
                    sentences.append(sentence)
    return sentences
