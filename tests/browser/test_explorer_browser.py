"""The FormatExplorer of notebook 02, driven in a real JupyterLab by a real browser."""

import re

from conftest import drag, screenshot


def text(page, selector: str) -> str:
    return page.locator(selector).first.inner_text().strip()


def settle(page) -> None:
    """Wait until the kernel is idle and the text box has stopped changing (a drag sends
    a burst of updates; typing before they land would be overwritten by them)."""
    box = page.locator(".labkit-explorer-input input").first
    page.wait_for_selector("#jp-main-statusbar >> text=Idle")
    last = None
    while (now := box.input_value()) != last:
        last = now
        page.wait_for_timeout(500)
    page.wait_for_selector("#jp-main-statusbar >> text=Idle")


def enter(page, value: str) -> None:
    settle(page)
    box = page.locator(".labkit-explorer-input input").first
    box.fill(value)
    box.press("Enter")


def test_explorer_reacts_to_typing_dragging_and_clicking(open_notebook):
    page = open_notebook("02_underflow_overflow.ipynb")
    page.wait_for_selector(".labkit-explorer .labkit-bit-fp16-15")
    page.locator(".labkit-explorer").first.scroll_into_view_if_needed()

    # Typing 256**2: fp16 overflows to inf; bf16 holds it exactly.
    enter(page, "256**2")
    page.wait_for_function("() => document.querySelector('.labkit-value-fp16').innerText.includes('inf')")
    assert page.locator(".labkit-flags-fp16 .labkit-flag-overflow").count() == 1
    assert page.locator(".labkit-flags-bf16 .labkit-flag-overflow").count() == 0
    assert text(page, ".labkit-hex-fp16") == "0x7c00"
    assert "65536" in text(page, ".labkit-value-bf16")

    # Typing 1e-5**2 = 1e-10: underflow to zero in fp16, not in bf16.
    enter(page, "1e-10")
    page.wait_for_selector(".labkit-flags-fp16 .labkit-flag-underflow")
    assert page.locator(".labkit-flags-bf16 .labkit-flag-underflow").count() == 0
    assert text(page, ".labkit-hex-fp16") == "0x0000"

    # A subnormal: 1e-7 in fp16.
    enter(page, "1e-7")
    page.wait_for_selector(".labkit-flags-fp16 .labkit-flag-subnormal")

    # A hex pattern in the chosen format (fp16 by default): 0x3c00 is 1.0.
    enter(page, "0x3c00")
    page.wait_for_function("() => document.querySelector('.labkit-hex-fp16').innerText.trim() === '0x3c00'")
    assert text(page, ".labkit-value-fp16") == "1.0"
    assert page.locator(".labkit-flags-fp32 .labkit-flag-exact").count() == 1
    bits_before = [page.locator(f".labkit-bit-fp16-{i}").first.inner_text() for i in range(16)]
    assert bits_before[10:15] == ["1", "1", "1", "1", "0"]  # exponent 01111, least significant first

    # Clicking the sign bit flips 1.0 to -1.0 in every format.
    page.locator(".labkit-bit-fp16-15").first.click()
    page.wait_for_function("() => document.querySelector('.labkit-value-fp16').innerText.trim().startsWith('-1')")
    assert text(page, ".labkit-hex-fp16") == "0xbc00"
    assert text(page, ".labkit-value-bf16").startswith("-1")

    # Dragging the slider changes the value shown.
    before = text(page, ".labkit-value-fp32")
    drag(page, page.locator(".labkit-explorer-slider .noUi-handle").first, 140)
    page.wait_for_function(
        "(old) => document.querySelector('.labkit-value-fp32').innerText.trim() !== old", arg=before
    )
    assert re.search(r"\d", text(page, ".labkit-value-fp32"))

    # Bad input: a message inside the widget, not a traceback.
    enter(page, "one point five")
    page.wait_for_selector(".labkit-explorer-message .labkit-error")
    assert page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").count() == 0
    screenshot(page, "explorer_02")
