"""Every function of the package fits on a screen and a half, every class in 400 code lines.

A code line is a line of the function's (or class's) source, decorators included, that is
neither blank nor a comment, outside its docstrings: a function's own docstring, and for a
class its docstring, its methods' docstrings and a class-level ``__doc__ = "..."``.
"""

import ast
from pathlib import Path

import pytest

import sklearn_ebound

PACKAGE = Path(sklearn_ebound.__file__).resolve().parent
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 400


def _docstring_node(node):
    """The docstring expression of a module, class or function, or None."""
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0]
    return None


def _class_docstrings(node):
    """The class's docstring, a class-level ``__doc__ = "..."``, its methods' docstrings."""
    found = [_docstring_node(node)]
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(_docstring_node(statement))
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) \
                else [statement.target]
            if any(isinstance(t, ast.Name) and t.id == "__doc__" for t in targets):
                found.append(statement)
    return [d for d in found if d is not None]


def code_lines(lines, node, docstrings):
    """How many lines of ``node`` are code: not blank, not a comment, not in ``docstrings``."""
    skipped = {i for d in docstrings for i in range(d.lineno, d.end_lineno + 1)}
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return sum(1 for i in range(first, node.end_lineno + 1)
               if i not in skipped and lines[i - 1].strip()
               and not lines[i - 1].strip().startswith("#"))


def _sizes():
    """``(kind, "module:line name", code lines)`` of every function and class of the package."""
    sizes = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        where = path.relative_to(PACKAGE.parent).as_posix()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                own = [d for d in [_docstring_node(node)] if d is not None]
                sizes.append(("function", f"{where}:{node.lineno} {node.name}",
                              code_lines(lines, node, own)))
            elif isinstance(node, ast.ClassDef):
                sizes.append(("class", f"{where}:{node.lineno} {node.name}",
                              code_lines(lines, node, _class_docstrings(node))))
    return sizes


def test_the_counter_skips_docstrings_comments_and_blank_lines():
    source = '''
@decorator
def f(x):
    """A docstring
    of two lines."""
    # a comment

    y = """a string that is code"""
    return x + y


class C:
    """The class's docstring."""

    __doc__ = """Its docstring set by assignment."""

    def m(self):
        """A method's docstring."""
        def inner():
            """A nested function's docstring: code for the class, and for m."""
        return 1
'''
    lines = source.splitlines()
    tree = ast.parse(source)
    f, c = tree.body
    assert code_lines(lines, f, [_docstring_node(f)]) == 4  # decorator, def, y =, return
    assert code_lines(lines, c, _class_docstrings(c)) == 5  # class, def m, def inner, 2 more
    m = c.body[2]
    assert code_lines(lines, m, [_docstring_node(m)]) == 4


def test_the_package_is_found():
    sizes = _sizes()
    assert len(sizes) > 500
    assert any(name.endswith(" IntrinsicRankEstimator") for _, name, _ in sizes)


@pytest.mark.parametrize("kind, limit", [("function", MAX_FUNCTION_LINES),
                                         ("class", MAX_CLASS_LINES)])
def test_no_function_nor_class_too_long(kind, limit):
    too_long = [f"{name}: {n} code lines" for k, name, n in _sizes() if k == kind and n > limit]
    assert not too_long, (f"{kind}s over {limit} code lines (split them into named steps):\n"
                          + "\n".join(too_long))
