"""Wrong answers of every kind for the checker's property tests: *specs* hypothesis draws, values ``build`` makes.

A spec is a plain tuple ``(kind, a, b, c)`` — picklable, so the same spec can travel to every rank of a launch
— and ``build(spec, right)`` turns it into what a learner's function returns:

    garbage     None, text, a dict, a set, a generator, a function, an object NumPy cannot read, a ragged
                list, a list with a hole, complex, a bool, huge and negative numbers, NaN, inf, a date, an
                empty array, a 0-d array, an object array, or an array hypothesis drew (``("array", x)``)
    changes     the right answer changed the ways a learner's slip changes it: scaled, shifted at one entry,
                negated, reversed, rolled, shuffled, transposed, flattened, an entry dropped or added, cast to
                int, float32, bools or text, made complex, zeroed, a scalar where a tuple is due and back,
                a NaN or an inf at one entry, or unchanged but as a list or a tuple
    raises      an exception, one whose ``str()`` raises too, NotImplementedError, SystemExit

``learner_functions`` wraps a reference solution so that its functions return spec after spec (the launched
program ``tests/programs/checks_under_fire.py`` writes a learner's file that calls it).
"""

from __future__ import annotations

import importlib.util
import itertools
import pickle

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

GARBAGE = ("none", "text", "bytes", "dict", "set", "generator", "function", "object", "unreadable", "ragged",
           "hole", "complex", "bool", "huge", "negative_huge", "nan", "inf", "date", "empty", "zero_d",
           "object_array")
CHANGES = ("scaled", "shifted", "negated", "reversed", "rolled", "shuffled", "transposed", "flattened", "dropped",
           "appended", "as_int", "as_float32", "as_bools", "as_text", "complexified", "zeros", "first_only",
           "wrapped", "nan_at", "inf_at", "as_list", "as_tuple")
RAISES = ("raise", "unprintable", "not_implemented", "exit")


class Unreadable:
    """Every way of reading it raises: NumPy's, len, iteration, float, str, repr."""

    def __array__(self, *args, **kwargs):
        raise RuntimeError("no array")

    def __len__(self):
        raise RuntimeError("no length")

    def __iter__(self):
        raise RuntimeError("no iteration")

    def __float__(self):
        raise RuntimeError("no float")

    def __str__(self):
        raise RuntimeError("no str")

    __repr__ = __str__


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("this exception cannot be printed")

    __repr__ = __str__


def _garbage(kind: str, a: float, b: int, text: str):
    made = {"none": lambda: None, "text": lambda: text, "bytes": lambda: text.encode(),
            "dict": lambda: {text: a, b: [a]}, "set": lambda: {b, b + 1}, "generator": lambda: (i for i in range(b)),
            "function": lambda: len, "object": object, "unreadable": Unreadable,
            "ragged": lambda: [[a, a], [a]], "hole": lambda: [a, None], "complex": lambda: complex(a, 1.0),
            "bool": lambda: bool(b % 2), "huge": lambda: 10 ** (20 + b % 400), "negative_huge": lambda: -10 ** 30,
            "nan": lambda: float("nan"), "inf": lambda: float("-inf") if b % 2 else float("inf"),
            "date": lambda: np.datetime64("2024-01-01"), "empty": lambda: np.zeros((0,) * (1 + b % 2)),
            "zero_d": lambda: np.array(a), "object_array": lambda: np.array([a, text, None], dtype=object)}
    return made[kind]()


def _numbers(right) -> np.ndarray | None:
    try:
        x = np.asarray(right)
        return x if x.dtype.kind in "biuf" else None
    except Exception:  # a ragged tuple (exercise 14's rows before the check reshapes them)
        return None


def _change(kind: str, right, a: float, b: int):
    if isinstance(right, dict) and right:  # exercise 11b: change one layer's (bytes, wire bytes)
        key = sorted(right, key=str)[b % len(right)]
        return {**right, key: _change(kind, right[key], a, b)}
    if isinstance(right, (tuple, list)) and right and _numbers(right) is None:  # 04b's five gradients
        i = b % len(right)
        return type(right)([*right[:i], _change(kind, right[i], a, b), *right[i + 1:]])
    x = _numbers(right)
    if x is None:
        return right
    y = x.astype(np.float64)
    flat = y.reshape(-1)
    i = b % max(flat.size, 1)
    if kind == "scaled":
        return y * a
    if kind == "shifted" and flat.size:
        flat[i] += a if a else 1.0
        return y
    if kind == "negated":
        return -y
    if kind in ("reversed", "rolled", "shuffled") and y.ndim:
        return y[::-1] if kind == "reversed" else np.roll(y, 1 + b, axis=0) if kind == "rolled" else \
            np.random.default_rng(b).permutation(y)
    if kind == "transposed":
        return y.T
    if kind == "flattened":
        return y.reshape(-1) if y.ndim != 1 else y.reshape(1, -1)
    if kind == "dropped" and flat.size:
        return np.delete(flat, i)
    if kind == "appended":
        return np.append(flat, a)
    if kind == "as_int":
        return np.nan_to_num(y).astype(np.int64)
    if kind == "as_float32":
        return y.astype(np.float32)
    if kind == "as_bools":
        return y != 0
    if kind == "as_text":
        return y.astype(str)
    if kind == "complexified":
        return y + 1j * a
    if kind == "zeros":
        return np.zeros_like(y)
    if kind == "first_only" and flat.size:
        return float(flat[0])
    if kind == "wrapped":
        return [y]
    if kind in ("nan_at", "inf_at") and flat.size:
        flat[i] = np.nan if kind == "nan_at" else np.inf
        return y
    if kind == "as_list":
        return y.tolist()
    if kind == "as_tuple":
        return tuple(flat.tolist())
    return y


def _raise(kind: str, text: str):
    if kind == "raise":
        raise ValueError(text)
    if kind == "unprintable":
        raise Unprintable()
    if kind == "not_implemented":
        raise NotImplementedError("TODO")
    raise SystemExit(3)


def build(spec: tuple, right=None, symptoms: dict | None = None):
    """The value (or the exception) that ``spec`` stands for; ``right``: the right answer, which a change
    changes; ``symptoms``: a check's ``{sentence: value}``, for ``("symptom", k)``."""
    kind = spec[0]
    if kind == "array":
        return spec[1]
    if kind == "right":
        return right
    if kind == "symptom":
        values = [v for v in (symptoms or {}).values() if v is not None]
        return values[spec[1] % len(values)] if values else None
    _, a, b, text = spec
    if kind in GARBAGE:
        return _garbage(kind, a, b, text)
    if kind in RAISES:
        _raise(kind, text)
    return _change(kind, right, a, b)


factors = st.sampled_from([2.0, 0.5, -1.0, 3.0, 1e-3, 1.0 + 1e-9, 1e9, -7.0, 0.0]) | st.floats(-1e12, 1e12)
texts = st.text(max_size=12)


def specs(kinds: tuple[str, ...]) -> st.SearchStrategy:
    return st.tuples(st.sampled_from(kinds), factors, st.integers(0, 10 ** 6), texts)


def arrays(shape: tuple[int, ...] | None = None) -> st.SearchStrategy:
    """``("array", x)``: an array of any numeric dtype, of ``shape`` or of any small shape (0-d, empty)."""
    dtypes = st.sampled_from([np.int8, np.int64, np.uint8, np.float16, np.float32, np.float64, np.bool_,
                              np.complex128])
    shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
    if shape is not None:
        shapes = st.just(shape) | shapes
    return st.builds(lambda x: ("array", x), hnp.arrays(dtypes, shapes))


def answers(shape: tuple[int, ...] | None = None, symptoms: int = 0, raises: bool = False) -> st.SearchStrategy:
    """Specs of every kind: garbage, arrays, changes of the right answer, a check's own symptoms, exceptions."""
    kinds = [specs(GARBAGE), arrays(shape), specs(CHANGES)]
    if symptoms:
        kinds.append(st.tuples(st.just("symptom"), st.integers(0, symptoms - 1)))
    if raises:
        kinds.append(specs(RAISES))
    return st.one_of(kinds)


def learner_functions(solution_path: str, plan_path: str, names: tuple[str, ...]) -> dict:
    """Functions ``names`` that return the values of the pickled plan (a list of specs), spec after spec in
    call order: a change calls the reference solution first and changes its result; garbage and exceptions
    do not call it (so a function that works in place leaves its arguments as they were)."""
    spec_ = importlib.util.spec_from_file_location("reference_solution", solution_path)
    reference = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(reference)
    with open(plan_path, "rb") as f:
        plan = pickle.load(f)
    turn = itertools.count()

    def wrapper(name: str):
        def fn(*args):
            spec = plan[next(turn) % len(plan)]
            right = getattr(reference, name)(*args) if spec[0] in CHANGES or spec[0] == "right" else None
            return build(spec, right)
        fn.__name__ = name
        return fn

    return {name: wrapper(name) for name in names}
