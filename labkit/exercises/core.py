"""The exercise machinery: an `Exercise` record, its answer kinds, the registry, `check` and `Feedback`.

An exercise computes its own answer key (`Exercise.solve`, from labkit.formats, ml_dtypes,
labkit.hardware, ...) each time it is checked, so the key can never drift from the library it
teaches. A wrong answer of the right type is *feedback*, not an exception: the first `Hint`
whose test matches names the likely misconception, without printing the key. Input that is not
an answer at all (an unknown exercise, a string where a number is expected) raises.

>>> ex = Exercise("demo_half", ("01",), "What is 1/2 in fp16?", "number", lambda: 0.5,
...               hints=(Hint(lambda a, key: a == 0.0, "0.5 is a normal fp16 number, far from underflow."),))
>>> ex.judge(0.0).message
'0.5 is a normal fp16 number, far from underflow.'
>>> ex.judge(0.5).correct
True
"""

from __future__ import annotations

import html
import math
import numbers
import re
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from labkit._validate import choice, shown

KINDS = {
    "number": "a number (int or float; float('inf') and float('nan') are numbers too)",
    "integer": "a whole number (an int)",
    "bool": "True or False",
    "precision": "a precision name: 'fp32', 'fp16', 'fp16 + loss scaling', 'bf16' or 'fp8'",
    "dtype": "a dtype name: 'fp32', 'bf16' or 'fp16' ('float32', 'bfloat16', 'float16' and 'half' work too)",
    "calls": "a list of call names, in order (see labkit.exercises.AMP_CALLS)",
}
"""Answer kinds: what `check` accepts for an exercise, as the TypeError says it."""

PRECISION_ANSWERS = ("fp32", "fp16", "fp16 + loss scaling", "bf16", "fp8")
DTYPE_ANSWERS = ("fp32", "bf16", "fp16")
"""The answers of a "dtype" exercise (a tensor's dtype), in the course's short names."""
DTYPE_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
"""The libraries' names of the `DTYPE_ANSWERS` (numpy's, torch's, JAX's, Keras'), as a "dtype" answer takes
them; an exercise's key turns a library's dtype name into the course's with it too."""
_PRECISION_ALIASES = {**DTYPE_ALIASES, "float8": "fp8"}
_DTYPE_PREFIX = re.compile(r"^(torch|jnp|np|numpy|tf|jax\.numpy|ml_dtypes)\.")
_DTYPE_OBJECT = re.compile(r"^(?:<dtype: '([\w.]+)'>|<class '([\w.]+)'>|([\w.]+))$")


def _dtype_text(answer) -> str | None:
    """The name a "dtype" answer writes: a string as it is, a numpy dtype's name, and any other object by its
    ``str()`` where that reads as a dtype's name -- ``torch.bfloat16`` (a tensor's ``.dtype``), TensorFlow's
    ``<dtype: 'float16'>``, ``jnp.float32`` (``<class 'jax.numpy.float32'>``): no framework is imported."""
    if isinstance(answer, str):
        return answer
    if isinstance(answer, np.dtype):
        return answer.name
    if isinstance(answer, (bool, np.bool_, numbers.Number, bytes)):
        return None
    try:
        found = _DTYPE_OBJECT.match(str(answer))
    except Exception:  # noqa: BLE001 -- an object that cannot print is no dtype
        return None
    return next((g for g in found.groups() if g), None) if found else None

AMP_CALLS = {
    "scaler.scale(loss).backward()": ("backward", "scale_backward", "scaler.scale(loss).backward"),
    "scaler.unscale_(opt)": ("unscale_", "unscale", "scaler.unscale_"),
    "clip": ("clip_grad_norm_", "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)"),
    "scaler.step(opt)": ("step", "scaler.step"),
    "scaler.update()": ("update", "scaler.update"),
}
"""The calls of one torch.amp step with gradient clipping, as the loop-order exercise names them
(canonical name -> the short names also accepted)."""
_CALL_NAMES = {alias: name for name, aliases in AMP_CALLS.items() for alias in (name, *aliases)}


def _kind_error(ex_id: str, kind: str, answer) -> TypeError:
    return TypeError(f"answer to {ex_id!r} must be {KINDS[kind]}; got {type(answer).__name__} {shown(answer)}")


def parse_answer(ex_id: str, kind: str, answer):
    """`answer` in the normal form of `kind`, or TypeError/ValueError saying what is expected."""
    if kind == "number":
        if isinstance(answer, (bool, np.bool_)) or not isinstance(answer, numbers.Real):
            raise _kind_error(ex_id, kind, answer)
        try:
            return float(answer)
        except OverflowError:
            raise ValueError(f"answer to {ex_id!r} must be a number a float64 can hold; got {shown(answer)}") from None
    if kind == "integer":
        if isinstance(answer, (bool, np.bool_)) or not isinstance(answer, numbers.Integral):
            raise _kind_error(ex_id, kind, answer)
        return int(answer)
    if kind == "bool":
        if not isinstance(answer, (bool, np.bool_)):
            raise _kind_error(ex_id, kind, answer)
        return bool(answer)
    if kind == "precision":
        if not isinstance(answer, str):
            raise _kind_error(ex_id, kind, answer)
        text = re.sub(r"\s+", " ", answer.strip().lower())
        for long, short in _PRECISION_ALIASES.items():
            text = re.sub(rf"\b{long}\b", short, text)
        text = re.sub(r"^fp16\s*(\+|with|and)\s*(dynamic )?(loss scaling|loss scale|ls|gradscaler)$",
                      "fp16 + loss scaling", text)
        if text not in PRECISION_ANSWERS:
            raise ValueError(f"answer to {ex_id!r} must be one of {', '.join(map(repr, PRECISION_ANSWERS))}; "
                             f"got {shown(answer)}")
        return text
    if kind == "dtype":  # "fp16", "float16", "torch.float16", "jnp.float16", a dtype object (p.grad.dtype)
        name = _dtype_text(answer)
        if name is None:
            raise _kind_error(ex_id, kind, answer)
        text = _DTYPE_PREFIX.sub("", name.strip().lower())
        text = DTYPE_ALIASES.get(text, text)
        if text not in DTYPE_ANSWERS:
            raise ValueError(f"answer to {ex_id!r} must be {KINDS[kind]}; got {shown(answer)}")
        return text
    if kind == "calls":
        if isinstance(answer, str) or not isinstance(answer, Sequence):
            raise _kind_error(ex_id, kind, answer)
        if len(answer) > 20:
            raise ValueError(f"answer to {ex_id!r} must be a short list of calls (one step); got {len(answer)} items")
        out = []
        for item in answer:
            if not isinstance(item, str):
                raise TypeError(f"answer to {ex_id!r} must hold call names (strings); got {type(item).__name__} "
                                f"{shown(item)}")
            key = re.sub(r"\s+", "", item.strip())
            name = next((n for a, n in _CALL_NAMES.items() if re.sub(r"\s+", "", a) == key), None)
            if name is None:
                raise ValueError(f"unknown call {shown(item)} in the answer to {ex_id!r}; name each call as one of "
                                 f"{', '.join(map(repr, AMP_CALLS))}")
            out.append(name)
        return tuple(out)
    raise ValueError(f"unknown answer kind {shown(kind)}; choose one of {', '.join(map(repr, KINDS))}")


@dataclass(frozen=True)
class Hint:
    """One wrong class: ``when(answer, key)`` recognises it, ``say`` explains it (a string, or
    ``say(answer, key) -> str``). ``say`` must never print the key."""

    when: Callable[[Any, Any], bool]
    say: str | Callable[[Any, Any], str]

    def __post_init__(self):
        if not callable(self.when):
            raise TypeError(f"Hint.when must be a function (answer, key) -> bool; got {shown(self.when)}")
        if not (isinstance(self.say, str) or callable(self.say)):
            raise TypeError(f"Hint.say must be a str or a function (answer, key) -> str; got {shown(self.say)}")

    def message(self, answer, key) -> str:
        return self.say if isinstance(self.say, str) else self.say(answer, key)


def _equal(answer, key) -> bool:
    if isinstance(key, float) and isinstance(answer, float):
        return answer == key or (math.isnan(answer) and math.isnan(key))
    return answer == key


@dataclass(frozen=True)
class Feedback:
    """What `check` says: ``correct``, and a message -- why it is right, or the likely misconception.

    Prints as one line (``✓ id: ...`` / ``✗ id: ...``), renders green or red in a notebook, and is
    truthy when correct (``assert check(...)`` works in a test).
    """

    exercise: str
    correct: bool
    message: str
    answered: bool = True

    def __post_init__(self):
        for name in ("exercise", "message"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"Feedback.{name} must be a str; got {shown(getattr(self, name))}")
        for name in ("correct", "answered"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Feedback.{name} must be True or False; got {shown(getattr(self, name))}")
        if self.correct and not self.answered:
            raise ValueError("Feedback: an exercise with no answer yet cannot be correct")

    def __bool__(self) -> bool:
        return self.correct

    @property
    def _mark(self) -> str:
        return "✓ right" if self.correct else "✗ not yet" if self.answered else "… your turn"

    def __str__(self) -> str:
        return f"{self._mark} ({self.exercise}): {self.message}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        color = "#1a7f37" if self.correct else "#cf222e" if self.answered else "#6e7781"
        mark = self._mark
        return (f'<div style="border-left:4px solid {color};padding:4px 8px"><b style="color:{color}">{mark}</b> '
                f"<code>{html.escape(self.exercise)}</code>: {html.escape(self.message)}</div>")


@dataclass(frozen=True)
class Exercise:
    """A question a learner answers in a cell, and how to judge the answer.

    ``solve()`` computes the answer key from the library (never typed in where it can be
    computed); ``accepts(answer, key)`` says whether an answer is right (default: equal, or
    within ``rel_tol`` for a number); ``hints`` are tried in order on a wrong answer, ``otherwise``
    is said when none matches; ``why`` is said with a right answer.
    """

    id: str
    notebooks: tuple[str, ...]
    question: str
    kind: str
    solve: Callable[[], Any]
    accepts: Callable[[Any, Any], bool] | None = None
    hints: tuple[Hint, ...] = ()
    otherwise: str = "Not this one: compute it with labkit (the question names the tool) and compare."
    why: str = ""
    rel_tol: float = 0.0

    def __post_init__(self):
        if not isinstance(self.id, str) or not re.fullmatch(r"[a-z0-9_]+", self.id):
            raise ValueError(f"Exercise.id must be lower-case letters, digits and _; got {shown(self.id)}")
        if isinstance(self.notebooks, str) or not isinstance(self.notebooks, (tuple, list)) or not all(
                isinstance(n, str) and re.fullmatch(r"\d\d", n) for n in self.notebooks) or not self.notebooks:
            raise ValueError(f"Exercise.notebooks must be a tuple of two-digit notebook numbers like ('01',); "
                             f"got {shown(self.notebooks)}")
        object.__setattr__(self, "notebooks", tuple(self.notebooks))
        for name in ("question", "otherwise", "why"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"Exercise.{name} must be a str; got {shown(getattr(self, name))}")
        choice("kind", self.kind, KINDS)
        if not callable(self.solve) or (self.accepts is not None and not callable(self.accepts)):
            raise TypeError("Exercise.solve must be a function () -> key, and accepts None or (answer, key) -> bool")
        if not isinstance(self.hints, (tuple, list)) or not all(isinstance(h, Hint) for h in self.hints):
            raise TypeError(f"Exercise.hints must be a tuple of Hint; got {shown(self.hints)}")
        object.__setattr__(self, "hints", tuple(self.hints))
        if isinstance(self.rel_tol, bool) or not isinstance(self.rel_tol, numbers.Real) or not 0 <= self.rel_tol < 1:
            raise ValueError(f"Exercise.rel_tol must be a number from 0 to 1; got {shown(self.rel_tol)}")

    def is_right(self, answer, key) -> bool:
        if self.accepts is not None:
            return bool(self.accepts(answer, key))
        if self.kind == "number" and self.rel_tol and math.isfinite(answer) and math.isfinite(key):
            return math.isclose(answer, key, rel_tol=self.rel_tol)
        return _equal(answer, key)

    def judge(self, answer) -> Feedback:
        """Feedback on `answer` (checked against `kind` first: TypeError/ValueError if it is not one).
        ``None`` is the notebook's placeholder: no answer yet, so no judgement and no hint."""
        if answer is None:
            return Feedback(self.id, False, f"no answer yet: replace None with {KINDS[self.kind]}, then run the cell.",
                            answered=False)
        answer = parse_answer(self.id, self.kind, answer)
        key = self.solve()
        if self.is_right(answer, key):
            return Feedback(self.id, True, self.why or "that is what labkit computes too.")
        for hint in self.hints:
            if hint.when(answer, key):
                return Feedback(self.id, False, hint.message(answer, key))
        return Feedback(self.id, False, self.otherwise)

    def __str__(self) -> str:
        return (f"Exercise {self.id} (notebook {', '.join(self.notebooks)})\n{self.question}\n"
                f"Answer with {KINDS[self.kind]}: check({self.id!r}, your_answer)")

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return (f"<div><b>Exercise <code>{html.escape(self.id)}</code></b> (notebook {', '.join(self.notebooks)})"
                f"<p>{html.escape(self.question)}</p><p><i>Answer with {html.escape(KINDS[self.kind])}:</i> "
                f"<code>check({html.escape(repr(self.id))}, your_answer)</code></p></div>")


_REGISTRY: dict[str, Exercise] = {}
EXERCISES = types.MappingProxyType(_REGISTRY)
"""Every exercise, by id (read-only)."""


def register(exercise: Exercise) -> Exercise:
    """Add `exercise` to `EXERCISES` (ValueError if its id is taken)."""
    if not isinstance(exercise, Exercise):
        raise TypeError(f"register takes an Exercise; got {type(exercise).__name__} {shown(exercise)}")
    if exercise.id in _REGISTRY:
        raise ValueError(f"exercise id {exercise.id!r} is taken")
    _REGISTRY[exercise.id] = exercise
    return exercise


def get(exercise_id: str) -> Exercise:
    """The exercise named `exercise_id`; ValueError listing the ids if there is none."""
    if not isinstance(exercise_id, str):
        raise TypeError(f"exercise_id must be an exercise id (a str); got {type(exercise_id).__name__} "
                        f"{shown(exercise_id)}")
    if exercise_id not in _REGISTRY:
        raise ValueError(f"unknown exercise_id {shown(exercise_id)}; the exercises are: {', '.join(_REGISTRY)}")
    return _REGISTRY[exercise_id]


def check(exercise_id: str, answer) -> Feedback:
    """Judge a learner's `answer` to exercise `exercise_id`: right, or wrong and why.

    A wrong answer of the right kind is a `Feedback` (``correct=False``) whose message aims at
    the likely misconception and never prints the answer. ``None`` is the placeholder a notebook
    stores: it says what kind of answer to put there, and nothing about the answer. An unknown id
    (ValueError, listing the ids) or an answer of the wrong kind (TypeError, saying what kind is
    expected) raises.

    >>> check("bf16_of_257", 256).correct
    True
    >>> print(check("bf16_of_257", 257).message)
    bf16 has 8 significant bits (7 stored, 1 implicit): 257 = 2^8 + 1 needs 9, so bf16 cannot hold it.
    >>> print(check("bf16_of_257", None))  # doctest: +ELLIPSIS
    … your turn (bf16_of_257): no answer yet: replace None with a number (int or float; ...), then run the cell.
    """
    return get(exercise_id).judge(answer)


def show(exercise_id: str) -> Exercise:
    """The exercise, to display its question in a notebook (it prints as the question text)."""
    return get(exercise_id)


def _short(question: str) -> str:
    """The question's first sentence, at most 72 characters (the `exercises` table's column)."""
    first = re.split(r"(?<=[.?!])\s", question, maxsplit=1)[0]
    return first if len(first) <= 72 else first[:69] + "..."


def exercises(notebook: str | None = None):
    """A `labkit.table.Table` of the exercises, in course order: all, or one notebook's (``"01"``, ``1``
    or ``"01_float_formats.ipynb"``); ValueError naming the notebooks that have exercises."""
    from labkit.table import Table

    if notebook is not None:
        if isinstance(notebook, (bool, np.bool_)) or not isinstance(notebook, (str, numbers.Integral)):
            raise TypeError(f"notebook must be a notebook number like '01' or 1, or None; got {shown(notebook)}")
        known = sorted({n for ex in _REGISTRY.values() for n in ex.notebooks})
        if isinstance(notebook, str):  # "01", or a notebook's file name: "01_float_formats.ipynb"
            notebook = notebook[:2] if re.match(r"\d\d(_|\.|$)", notebook) else notebook
        else:
            notebook = f"{int(notebook):02d}" if 0 <= notebook < 100 else str(notebook)
        if notebook not in known:
            raise ValueError(f"notebook {shown(notebook)} has no exercises; choose one of {', '.join(known)}")
    rows = [(ex.id, ", ".join(ex.notebooks), ex.kind, _short(ex.question))  # in course order, then as registered
            for ex in sorted(_REGISTRY.values(), key=lambda ex: ex.notebooks[0])
            if notebook is None or notebook in ex.notebooks]
    title = "Exercises" + (f" of notebook {notebook}" if notebook else "") + ": check(id, answer)"
    return Table(("id", "notebook", "answer", "question"), tuple(rows), title)


__all__ = ["AMP_CALLS", "DTYPE_ALIASES", "DTYPE_ANSWERS", "EXERCISES", "KINDS", "PRECISION_ANSWERS", "Exercise",
           "Feedback", "Hint", "check", "exercises", "get", "register", "show"]
