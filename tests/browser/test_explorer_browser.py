"""The FormatExplorer of notebook 02, driven in a real JupyterLab by a real browser."""

import re

from conftest import drag, screenshot
from playwright.sync_api import expect


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


def see(page, selector: str):
    """An assertion on the first match that waits for it to come true. The widget updates
    one row at a time, each in its own message: a row read as soon as another row has
    changed may still show the last value (CI once read bf16's 0.1 beside fp16's inf)."""
    return expect(page.locator(selector).first)


def test_explorer_reacts_to_typing_dragging_and_clicking(open_notebook):
    page = open_notebook("02_underflow_overflow.ipynb")
    page.wait_for_selector(".labkit-explorer .labkit-bit-fp16-15")
    page.locator(".labkit-explorer").first.scroll_into_view_if_needed()

    # Typing 256**2: fp16 overflows to inf; bf16 holds it exactly.
    enter(page, "256**2")
    see(page, ".labkit-hex-fp16").to_have_text("0x7c00")
    see(page, ".labkit-value-fp16").to_contain_text("inf")
    see(page, ".labkit-flags-fp16 .labkit-flag-overflow").to_be_visible()
    see(page, ".labkit-hex-bf16").to_have_text("0x4780")
    see(page, ".labkit-value-bf16").to_contain_text("65536")
    see(page, ".labkit-flags-bf16 .labkit-flag-exact").to_be_visible()
    expect(page.locator(".labkit-flags-bf16 .labkit-flag-overflow")).to_have_count(0)

    # Typing 1e-5**2 = 1e-10: underflow to zero in fp16, not in bf16.
    enter(page, "1e-10")
    see(page, ".labkit-hex-fp16").to_have_text("0x0000")
    see(page, ".labkit-flags-fp16 .labkit-flag-underflow").to_be_visible()
    see(page, ".labkit-hex-bf16").to_have_text("0x2edc")
    see(page, ".labkit-flags-bf16 .labkit-flag-rounded").to_be_visible()
    expect(page.locator(".labkit-flags-bf16 .labkit-flag-underflow")).to_have_count(0)

    # A subnormal: 1e-7 in fp16.
    enter(page, "1e-7")
    see(page, ".labkit-hex-fp16").to_have_text("0x0002")
    see(page, ".labkit-flags-fp16 .labkit-flag-subnormal").to_be_visible()

    # A hex pattern in the chosen format (fp16 by default): 0x3c00 is 1.0.
    enter(page, "0x3c00")
    see(page, ".labkit-hex-fp16").to_have_text("0x3c00")
    see(page, ".labkit-value-fp16").to_have_text("1.0")
    see(page, ".labkit-hex-fp32").to_have_text("0x3f800000")
    see(page, ".labkit-flags-fp32 .labkit-flag-exact").to_be_visible()
    for i, bit in zip(range(10, 15), "11110"):  # exponent 01111, least significant first
        see(page, f".labkit-bit-fp16-{i}").to_have_text(bit)

    # Clicking the sign bit flips 1.0 to -1.0 in every format.
    page.locator(".labkit-bit-fp16-15").first.click()
    see(page, ".labkit-hex-fp16").to_have_text("0xbc00")
    see(page, ".labkit-value-fp16").to_have_text(re.compile(r"^-1"))
    see(page, ".labkit-hex-bf16").to_have_text("0xbf80")
    see(page, ".labkit-value-bf16").to_have_text(re.compile(r"^-1"))

    # Dragging the slider changes the value shown.
    settle(page)
    before = text(page, ".labkit-value-fp32")
    drag(page, page.locator(".labkit-explorer-slider .noUi-handle").first, 140)
    see(page, ".labkit-value-fp32").not_to_have_text(before)
    see(page, ".labkit-value-fp32").to_have_text(re.compile(r"\d"))

    # Bad input: a message inside the widget, not a traceback.
    enter(page, "one point five")
    see(page, ".labkit-explorer-message .labkit-error").to_be_visible()
    expect(page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")).to_have_count(0)
    screenshot(page, "explorer_02")
