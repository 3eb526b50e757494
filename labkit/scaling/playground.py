"""What the scaler playground widget computes, as plain functions (no ipywidgets here).

A learner types options and an overflow pattern as text; these functions read them
(ValueError with a message on anything else) and run the preset. The widget in
``labkit.widgets.scaling`` only copies the results into its controls. Numbers are read
by ``labkit.widgets.parse.parse_number``, the parser of every widget's text box.

>>> parse_pattern("..x.x").tolist()
[False, False, True, False, True]
>>> int(parse_pattern("random 1000 p=0.1 seed=3").sum())
102
>>> parse_option("torch", "init_scale", "2**10")
1024.0
>>> run("deepspeed", {"init_scale": "8", "hysteresis": "2"}, "xxx").scales.tolist()
[8.0, 8.0, 4.0]
"""

from __future__ import annotations

import math
import numbers
import re

import numpy as np

from labkit._validate import choice, integer, number, shown
from labkit.scaling.registry import get_preset
from labkit.scaling.trace import Trace, overflow_pattern, simulate
from labkit.widgets.parse import parse_number

MAX_STEPS = 100_000  # the longest pattern the playground replays and draws (in about a second)
PATTERN_HELP = ("a drawing such as ....x...xx (x = overflow), or: random STEPS p=0.01 seed=0 | "
                "every STEPS k=50 | burst STEPS start=20 length=10 | none STEPS")
_INT = re.compile(r"[+-]?\d{1,18}")  # an integer typed as such (longer ones: read as numbers)
_SETTINGS = {"random": ("p", "seed"), "every": ("k",), "burst": ("start", "length"), "none": ()}


def option_kind(preset, name) -> str:
    """"bool", "int", "number" or "optional" (a number or None), from the default's type."""
    p = get_preset(preset)
    default = p.defaults[choice(f"{p.name} option", name, p.defaults)]
    if isinstance(default, bool):
        return "bool"
    if default is None:
        return "optional"
    return "int" if isinstance(default, int) else "number"


def format_default(value) -> str:
    """A default as the learner would type it: 65536.0 -> '2**16'."""
    if value is None or isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):  # exact, however large
        value = int(value)
        power = value > 0 and value & (value - 1) == 0 and value.bit_length() - 1 >= 4
        return f"2**{value.bit_length() - 1}" if power else shown(value)
    if number("value", value, finite=False) > 0:
        m, e = math.frexp(value)
        if m == 0.5 and abs(e - 1) >= 4:
            return f"2**{e - 1}"
    return str(value)


def parse_option(preset, name, text):
    """Read one option typed as text (numbers may be written 2**16, 1e-3, 2^-4).

    Whether the value suits the option (e.g. a growth interval >= 1) is checked by
    ``simulate``, with the option's name in the message.
    """
    kind = option_kind(preset, name)
    if kind == "bool":
        if isinstance(text, bool):
            return text
        if str(text).strip().lower() in ("true", "false"):
            return str(text).strip().lower() == "true"
        raise ValueError(f"{name} must be True or False; got {shown(text)}")
    text = str(text).strip()
    if kind == "optional" and text.lower() in ("none", ""):
        return None
    if kind in ("int", "optional") and _INT.fullmatch(text):
        return int(text)
    try:
        value = parse_number(text)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    if kind == "int" and math.isfinite(value) and value == int(value):
        return int(value)
    return value


def parse_pattern(text: str) -> np.ndarray:
    """An overflow pattern from one line of text (see PATTERN_HELP), at most MAX_STEPS steps.

    Every message starts with the pattern as typed.
    """
    if not isinstance(text, str):
        raise TypeError(f"the pattern must be text: {PATTERN_HELP}")
    try:
        return _pattern(text)
    except ValueError as e:
        raise ValueError(f"pattern {shown(text.strip())}: {e}") from None


def _pattern(text: str) -> np.ndarray:
    compact = text.replace(" ", "")
    if compact and set(compact) <= {".", "x"}:
        if len(compact) > MAX_STEPS:
            raise ValueError(f"the playground draws at most {MAX_STEPS} steps; this drawing has {len(compact)}")
        return overflow_pattern(compact)
    words = text.split()
    if not words:
        raise ValueError(f"the pattern is empty; type {PATTERN_HELP}")
    if words[0] not in _SETTINGS:
        raise ValueError(f"cannot read the pattern; type {PATTERN_HELP}")
    kind, rest = words[0], words[1:]
    if not rest or not _INT.fullmatch(rest[0]):
        raise ValueError(f"give the number of steps after {kind!r}, 1 to {MAX_STEPS}, e.g. '{kind} 200'")
    if int(rest[0]) > MAX_STEPS:
        raise ValueError(f"the playground draws at most {MAX_STEPS} steps; got {rest[0]}")
    steps, keys = integer("steps", int(rest[0]), minimum=1), {}
    for word in rest[1:]:
        key, sep, value = word.partition("=")
        allowed = _SETTINGS[kind]
        if not sep or key not in allowed:
            raise ValueError(f"{kind} takes {', '.join(k + '=...' for k in allowed) or 'no settings'}; "
                             f"got {shown(word)}")
        keys[key] = _probability(value) if key == "p" else _whole(key, value, minimum=1 if key == "k" else 0)
    if kind == "random":
        return overflow_pattern("random", steps, p=keys.get("p", 0.01), seed=keys.get("seed", 0))
    if kind == "every":
        return overflow_pattern("every", steps, every=keys.get("k", 50))
    if kind == "burst":
        return overflow_pattern("burst", steps, start=keys.get("start", 0), length=keys.get("length", 10))
    return overflow_pattern("none", steps)


def _probability(value: str) -> float:
    try:
        return number("p", parse_number(value), minimum=0, maximum=1)
    except ValueError:
        raise ValueError(f"p must be a probability from 0 to 1, such as p=0.01; got {shown(value)}") from None


def _whole(key: str, value: str, minimum: int) -> int:
    if not _INT.fullmatch(value):
        raise ValueError(f"{key} must be a whole number >= {minimum}, such as {key}=10; got {shown(value)}")
    return integer(key, int(value), minimum=minimum)


def read(preset, option_texts: dict, pattern_text: str) -> tuple[dict, np.ndarray]:
    """The options and the overflow flags, parsed: what ``run`` simulates.

    Any bad input: one ValueError that names every bad option, and the pattern if it is
    bad, each with what was typed.
    """
    p = get_preset(preset)
    if not isinstance(option_texts, dict):
        raise TypeError(f"option_texts must be a dict {{option name: text}}; got {type(option_texts).__name__}")
    options, errors = {}, []
    for name, text in option_texts.items():
        try:
            options[name] = parse_option(p.name, name, text)
        except (ValueError, TypeError) as e:
            errors.append(str(e))
    try:
        flags = parse_pattern(pattern_text)
    except (ValueError, TypeError) as e:
        errors.append(str(e))
    if errors:
        raise ValueError("; ".join(errors))
    return options, flags


def run(preset, option_texts: dict, pattern_text: str) -> Trace:
    """Parse the options and the pattern (see ``read``), then simulate."""
    options, flags = read(preset, option_texts, pattern_text)
    return simulate(get_preset(preset).name, flags, **options)


def summary_html(trace: Trace) -> str:
    """A one-table HTML summary of a trace for the widget."""
    if not isinstance(trace, Trace):
        raise TypeError(f"summary_html() takes a Trace (from simulate); got {type(trace).__name__}")
    s = trace.summary()
    rows = [("steps", s["steps"]), ("overflows", s["overflows"]), ("updates skipped", s["skipped"]),
            ("inf/nan applied to the weights", s["poisoned"]), ("smallest scale", f"{s['min_scale']:g}"),
            ("largest scale", f"{s['max_scale']:g}"), ("final scale", f"{s['final_scale']:g}")]
    if trace.stopped_at is not None:
        rows.append(("training stopped at step", trace.stopped_at))
    body = "".join(f"<tr><td>{k}</td><td><b>{v}</b></td></tr>" for k, v in rows)
    return f"<table class='labkit-playground-summary'>{body}</table>"
