"""What a learner's function returned, in words and as numbers, whatever it is (MPI-free).

A learner's function may return anything: None, text, a dict, a generator, a ragged list, complex numbers, an
object whose ``__len__``, ``__array__`` or ``__str__`` raises. The checker reads such a value only through
these functions, and none of them raises:

    as_numbers(value)   (float64 array, dtype kind of what was returned) — or one sentence saying why not
    describe(value)     a few words naming it: "None", "a dict with 2 keys", "an array of shape (3,) (int64)"
    safe_text(obj)      str(obj) on one line, shortened, that cannot fail (an exception's message, say)
    number(x)           3 → "3", 1.5e9 → "1500000000", 0.1 → "0.1", nan → "nan"

The sentences speak of the learner's value only: they never name the answer.
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np

LIMIT = 80  # characters of a learner's text (an exception message, a str they returned) kept in a message


def safe_text(obj, limit: int = LIMIT) -> str:
    """``str(obj)`` on one line, at most ``limit`` characters; ``repr`` or the type's name if ``str`` raises."""
    for render in (str, repr):
        try:
            text = render(obj)
            if isinstance(text, str):
                break
        except Exception:  # a __str__ of the learner's own that raises: say what it is instead
            continue
    else:
        text = f"<{type(obj).__name__}, which cannot be printed>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def number(x: float) -> str:
    """A number as a learner would write it: whole numbers in full (byte counts), others to 6 digits."""
    x = float(x)
    if np.isfinite(x) and x == round(x) and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.6g}"


def _length(value) -> int | None:
    try:
        return len(value)
    except Exception:  # no length, or a __len__ that raises
        return None


def describe(value) -> str:
    """A noun phrase for ``value``: what the learner's function returned, without judging it."""
    try:
        return _describe(value)
    except Exception:  # a value that fails even to be looked at
        return f"{_a(type(value).__name__)} object"


def _describe(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, (bool, np.bool_)):
        return f"a bool ({bool(value)})"
    if isinstance(value, (complex, np.complexfloating)):
        return f"a complex number ({safe_text(value)})"
    if isinstance(value, (numbers.Number, np.number)):
        return f"the number {safe_text(value)}"
    if isinstance(value, str):
        return f"a str ({safe_text(repr(value), 40)})"
    if isinstance(value, (bytes, bytearray)):
        return f"a {type(value).__name__} object of {_length(value)} bytes"
    if isinstance(value, np.ndarray):
        shape = "a 0-d array" if value.ndim == 0 else f"an array of shape {value.shape}"
        return f"{shape} ({value.dtype})"
    n = _length(value)
    kind = type(value).__name__
    if isinstance(value, dict):
        return f"a {kind} with {n} key{'' if n == 1 else 's'}"
    if isinstance(value, (list, tuple, set, frozenset)):
        return f"a {kind} of {n} item{'' if n == 1 else 's'}"
    if hasattr(value, "__next__"):
        return f"{_a(kind)} (an iterator: its items are made one at a time, on demand)"
    if callable(value):
        return f"a function or class ({safe_text(getattr(value, '__name__', kind), 40)})"
    return f"{_a(kind)} object"


def _a(word: str) -> str:
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def _first_non_number(array: np.ndarray):
    """``(index, item)`` of the first item of an object array that is not a real number, or ``None``."""
    for index, item in np.ndenumerate(array):
        if isinstance(item, (complex, np.complexfloating)) or not isinstance(item, (numbers.Number, np.number)):
            return index, item
    return None


def _ragged(value) -> str:
    lengths = []
    for item in list(value)[:6]:
        n = _length(item)
        lengths.append("a number" if n is None else str(n))
    more = ", …" if (_length(value) or 0) > 6 else ""
    return f"its items have different lengths ({', '.join(lengths)}{more}), so they do not make an array"


def _where(index: tuple) -> str:
    return "" if not index else f" at index {index[0] if len(index) == 1 else index}"


def as_numbers(value) -> tuple[np.ndarray, str] | str:
    """``(value as a float64 array, the dtype kind of what was returned)``, or a sentence saying why ``value``
    is not numbers ("your function returned None (a missing return statement?)"). Bools count as 0 and 1."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NumPy's warnings about odd values: the sentence says it better
            return _numbers(value)
    except Exception as err:  # anything else an odd object can do while NumPy reads it
        return f"your function returned {describe(value)}, which cannot be read as numbers ({type(err).__name__})"


def _numbers(value) -> tuple[np.ndarray, str] | str:
    said = f"your function returned {describe(value)}"
    if value is None:
        return "your function returned None (a missing return statement?)"
    if isinstance(value, (str, bytes, bytearray)):
        return f"{said}: text, not numbers"
    if isinstance(value, (dict, set, frozenset)):
        return f"{said}: return a list, a tuple or an array (a {type(value).__name__} has no order)"
    if hasattr(value, "__next__") and not isinstance(value, np.ndarray):
        return f"{said}: return a list or an array (list(...) of it, say)"
    try:
        array = np.asarray(value)
    except ValueError:  # NumPy refuses ragged nesting
        return f"{said}: {_ragged(value)}" if isinstance(value, (list, tuple)) else f"{said}, not an array"
    kind = array.dtype.kind
    if kind in "biuf":
        return array.astype(np.float64), kind
    if kind == "c":
        return f"{said}: complex numbers (a square root or a log of a negative number?)"
    if kind in "US":
        return f"{said}, holding text, not numbers"
    if kind == "O":
        bad = _first_non_number(array)
        if bad is not None:
            index, item = bad
            if array.ndim == 0:
                return f"{said}, not numbers"
            return f"{said}, holding {describe(item)}{_where(index)}, not a number"
        return array.astype(np.float64), "f"  # Python ints too large for int64, Fractions, Decimals
    return f"{said}, holding {array.dtype} values, not numbers"
