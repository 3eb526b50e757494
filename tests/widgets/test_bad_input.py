"""Every text box of every widget, fed one shared list of bad (and tricky) input.

No browser: each entry is set as the text box's ``.value``, as the browser would after
Enter. The boxes are found by walking each widget's children, under every setting of
its drop-downs (the playground's presets build their own option boxes), so a new widget
in ``labkit.widgets.__all__`` or a new text box is covered here without a line more.

For each entry: nothing escapes (an exception in a handler would be raised by the
set), and the message line is about *this* input -- it is empty, or it names the input
or the box, and it is the same whatever was typed before (the message line of issue 12
kept the previous input's error) -- and it comes from a ValueError/TypeError, not from
an exception the widget did not expect. Back at its default, a box clears the message.

To stay quick (a redraw of the playground is a few tenths of a second), a box like one
already typed into -- the same tooltip (the kind of value it takes) and the same default,
such as the pattern box under each preset -- is typed into once. What each preset then
makes of a value is the API fuzz test's concern (``simulate`` with bad options).
"""

import html
import re

import numpy as np
import pytest

ipywidgets = pytest.importorskip("ipywidgets")

import labkit.widgets  # noqa: E402
from labkit.scaling.registry import PRESETS  # noqa: E402

BAD_INPUT = [
    "", " ", "abc", "2**100000", "0**-1", "0^-1", "2**99999999999", "9**9**9**9", "2**-1074", "1e-320", "-2**2",
    "nan", "inf", "-inf", "1e400", "-0", "0x", "0x_", "0xZZ", "0b", "0x1p99999", "1/0", "0/0", "()", "[]", "1,5",
    "1e", "2**", "__import__(\"os\")", "open('x')", "None", "True", "(-8)**(1/3)", "(" * 300 + "1" + ")" * 300,
    "1" * 5000, "random 10 p=abc", "random 10 p=2", "random 10 seed=x", "every 0 k=1", "burst 10 start=-1",
    "random 99999999999999999999999", "..x..y", "<b>1</b>", "ｘｘ", "💥", "\x00", "\u200b", "½", "é",
]
BIG_PATTERNS = ["random 100000 p=1", "x" * 100_000]  # the largest patterns allowed: about 0.5 s each to draw


def sample():
    rng = np.random.default_rng(0)
    return {"weights": (2.0 ** rng.uniform(-28, -4, 500)).astype(np.float32),
            "activations": (2.0 ** rng.uniform(-30, -6, 500)).astype(np.float32)}


# One way to build each public widget; the test below fails when a widget is added without one.
FACTORIES = {
    "BlockExplorer": lambda: labkit.widgets.BlockExplorer(),
    "FormatExplorer": lambda: labkit.widgets.FormatExplorer("0.1"),
    "LossScaleExplorer": lambda: labkit.widgets.LossScaleExplorer(sample(), formats=("fp16",)),
    "ScalerPlayground": lambda: labkit.widgets.ScalerPlayground("torch", pattern="x..x"),
}


def walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from walk(child)


def text_boxes(widget):
    return [w for w in walk(widget) if isinstance(w, (ipywidgets.Text, ipywidgets.Textarea))]


def settings(widget):
    """(dropdown, option) for every option of every drop-down, the first being as built."""
    yield None, None
    for dropdown in [w for w in walk(widget) if isinstance(w, ipywidgets.Dropdown)]:
        first = dropdown.value
        for option in dropdown.options:
            value = option[1] if isinstance(option, tuple) else option
            if value != first:
                yield dropdown, value


def error(widget) -> str:
    """The error shown in the message line, unescaped ('' when there is none)."""
    text = widget.message.value
    return html.unescape(re.sub("<[^>]+>", "", text)) if "labkit-error" in text else ""


def refers_to(message: str, entry: str, box) -> bool:
    """The message quotes the input (as repr shows it), calls it empty, or names the box."""
    raw = entry.strip()
    return (not raw and "empty" in message) or repr(raw)[1:-1][:20] in message or box.description in message


def test_every_public_widget_has_a_factory():
    # explorer_view is the text FormatExplorer shows, a plain function (its bad input: tests/_fuzz.py)
    assert set(FACTORIES) == set(labkit.widgets.__all__) - {"explorer_view"}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_bad_input_in_every_text_box_shows_a_message_about_that_input(name):
    widget = FACTORIES[name]()
    assert not error(widget)
    typed, seen, found = 0, set(), set()
    for dropdown, option in settings(widget):
        if dropdown is not None:
            dropdown.value = option
        baseline = error(widget)  # e.g. optax, which has no default for max_consecutive_errors
        for box in text_boxes(widget):
            found.add((dropdown and option, box.description))
            default = box.value
            # A box like one typed into already -- the pattern box under each preset, an option
            # of the same kind (its tooltip) and the same default under another preset or name
            # -- reads text with the same code: it is typed into once.
            if (box.tooltip, default) in seen:
                continue
            seen.add((box.tooltip, default))
            for entry in BAD_INPUT + BIG_PATTERNS:
                box.value = entry  # an exception in a handler would escape here
                message = error(widget)
                if message and message != baseline:
                    assert refers_to(message, entry, box), (box.description, entry, message)
                    assert "Error:" not in message, (box.description, entry, message)  # only ValueError/TypeError
                    box.value = "abc" if entry != "abc" else "xyz"
                    box.value = entry  # the same message, whatever was typed before
                    assert error(widget) == message, (box.description, entry)
                typed += 1
            box.value = default
            assert error(widget) == baseline, (box.description, "back to the default")
    assert typed >= len(BAD_INPUT)
    if name == "ScalerPlayground":  # the walk found a box for each option of each preset
        wanted = {(p, n) for p in PRESETS for n, d in PRESETS[p].defaults.items() if not isinstance(d, bool)}
        assert {(p or "torch", n) for p, n in found} == wanted | {(p, "pattern") for p in PRESETS}


def test_constructor_arguments_are_named_when_refused():
    from labkit.widgets import FormatExplorer, ScalerPlayground

    with pytest.raises(ValueError, match="^pattern_format: unknown float format"):
        FormatExplorer(pattern_format="fp9")
    with pytest.raises(TypeError, match="^pattern must be a str"):
        ScalerPlayground(pattern=5)
    with pytest.raises(ValueError, match="^index must be a bit of fp16: 0 .. 15"):
        FormatExplorer().bit_button("fp16", 16)
