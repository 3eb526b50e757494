"""What the scaler playground widget computes, as plain functions (no ipywidgets here).

A learner types options and an overflow pattern as text; these functions read them
(ValueError with a message on anything else) and run the preset. The widget in
``labkit.widgets.scaling`` only copies the results into its controls.

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
import re

from labkit.scaling.registry import get_preset
from labkit.scaling.trace import Trace, overflow_pattern, simulate

PATTERN_HELP = ("a drawing such as ....x...xx (x = overflow), or: random STEPS p=0.01 seed=0 | "
                "every STEPS k=50 | burst STEPS start=20 length=10 | none STEPS")
_INT = re.compile(r"[+-]?\d+")


def option_kind(preset, name) -> str:
    """"bool", "int", "number" or "optional" (a number or None), from the default's type."""
    default = get_preset(preset).defaults[name]
    if isinstance(default, bool):
        return "bool"
    if default is None:
        return "optional"
    return "int" if isinstance(default, int) else "number"


def format_default(value) -> str:
    """A default as the learner would type it: 65536.0 -> '2**16'."""
    if value is None or isinstance(value, bool):
        return str(value)
    if value > 0:
        m, e = math.frexp(value)
        if m == 0.5 and abs(e - 1) >= 4:
            return f"2**{e - 1}"
    return str(value)


_POWER = re.compile(r"([+-]?\d+(?:\.\d*)?)\s*(?:\*\*|\^)\s*([+-]?\d+)")


def parse_number(text: str) -> float:
    """'65536', '1e-3', '2**16', '2^-4' -> float."""
    m = _POWER.fullmatch(text)
    if m:
        return float(m.group(1)) ** int(m.group(2))
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"type a number such as 65536, 1e-3, 2**16 or 2^-4; got {text!r}") from None


def parse_option(preset, name, text):
    """Read one option typed as text (numbers may be written 2**16, 1e-3, 2^-4)."""
    kind = option_kind(preset, name)
    if kind == "bool":
        if isinstance(text, bool):
            return text
        if str(text).strip().lower() in ("true", "false"):
            return str(text).strip().lower() == "true"
        raise ValueError(f"{name} must be True or False; got {text!r}")
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


def parse_pattern(text: str):
    """An overflow pattern from one line of text (see PATTERN_HELP)."""
    if not isinstance(text, str):
        raise TypeError(f"the pattern must be text: {PATTERN_HELP}")
    compact = text.replace(" ", "")
    if compact and set(compact) <= {".", "x"}:
        return overflow_pattern(compact)
    words = text.split()
    if not words or words[0] not in ("random", "every", "burst", "none"):
        raise ValueError(f"cannot read the pattern {text!r}; type {PATTERN_HELP}")
    kind, rest = words[0], words[1:]
    if not rest or not _INT.fullmatch(rest[0]):
        raise ValueError(f"give the number of steps after {kind!r}, e.g. '{kind} 200'")
    steps, keys = int(rest[0]), {}
    for word in rest[1:]:
        key, sep, value = word.partition("=")
        allowed = {"random": ("p", "seed"), "every": ("k",), "burst": ("start", "length"), "none": ()}[kind]
        if not sep or key not in allowed:
            raise ValueError(f"{kind} takes {', '.join(k + '=...' for k in allowed) or 'no settings'}; got {word!r}")
        keys[key] = float(value) if key == "p" else _int_setting(key, value)
    if steps > 100_000:
        raise ValueError(f"the playground draws at most 100000 steps; got {steps}")
    if kind == "random":
        return overflow_pattern("random", steps, p=keys.get("p", 0.01), seed=keys.get("seed", 0))
    if kind == "every":
        return overflow_pattern("every", steps, every=keys.get("k", 50))
    if kind == "burst":
        return overflow_pattern("burst", steps, start=keys.get("start", 0), length=keys.get("length", 10))
    return overflow_pattern("none", steps)


def _int_setting(key, value) -> int:
    if not _INT.fullmatch(value):
        raise ValueError(f"{key} must be a whole number; got {value!r}")
    return int(value)


def run(preset, option_texts: dict, pattern_text: str) -> Trace:
    """Parse the options and the pattern, then simulate (any bad input: ValueError/TypeError)."""
    p = get_preset(preset)
    options = {name: parse_option(p.name, name, text) for name, text in option_texts.items()}
    return simulate(p.name, parse_pattern(pattern_text), **options)


def summary_html(trace: Trace) -> str:
    """A one-table HTML summary of a trace for the widget."""
    s = trace.summary()
    rows = [("steps", s["steps"]), ("overflows", s["overflows"]), ("updates skipped", s["skipped"]),
            ("inf/nan applied to the weights", s["poisoned"]), ("smallest scale", f"{s['min_scale']:g}"),
            ("largest scale", f"{s['max_scale']:g}"), ("final scale", f"{s['final_scale']:g}")]
    if trace.stopped_at is not None:
        rows.append(("training stopped at step", trace.stopped_at))
    body = "".join(f"<tr><td>{k}</td><td><b>{v}</b></td></tr>" for k, v in rows)
    return f"<table class='labkit-playground-summary'>{body}</table>"
