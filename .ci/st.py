"""The schemathesis CLI, with one workaround.

CPython up to 3.11.7 can raise SystemError ("AST constructor recursion depth mismatch",
python/cpython#106905) from ast.parse deep in a call stack; hypothesis calls it only to describe
a filter lambda for display. Such a description falls back to a placeholder.
"""

import sys

import hypothesis.internal.lambda_sources as sources

_describe = sources._lambda_description


def _safe_describe(f, *args, **kwargs):
    try:
        return _describe(f, *args, **kwargs)
    except SystemError:
        return "lambda: <unknown>"


sources._lambda_description = _safe_describe

from schemathesis.cli import schemathesis  # noqa: E402

sys.exit(schemathesis())
