"""The loss-scaling widgets of notebook 03, driven in a real JupyterLab by a real browser."""

from conftest import drag, screenshot
from playwright.sync_api import expect

from labkit.scaling import playground

SUMMARY = ".labkit-playground-summary"


def summary(page) -> dict[str, str]:
    """The playground's summary table as {row name: value}."""
    rows = page.locator(f"{SUMMARY} tr")
    return {rows.nth(i).locator("td").nth(0).inner_text(): rows.nth(i).locator("td").nth(1).inner_text()
            for i in range(rows.count())}


def wait_for_new_summary(page, old: dict) -> dict:
    page.wait_for_function(
        """(old) => {
            const rows = [...document.querySelectorAll('.labkit-playground-summary tr')];
            const now = Object.fromEntries(rows.map(r => [r.cells[0].innerText, r.cells[1].innerText]));
            return JSON.stringify(now) !== JSON.stringify(old);
        }""",
        arg=old,
    )
    return summary(page)


def test_playground_trajectory_follows_preset_options_and_pattern(open_notebook):
    page = open_notebook("03_loss_scaling.ipynb")
    play = page.locator(".labkit-playground").first
    play.scroll_into_view_if_needed()
    page.wait_for_selector(f"{SUMMARY} tr")
    first = summary(page)
    # The notebook opens it on DeepSpeed, which raises when the scale reaches min_loss_scale.
    trace = playground.run("deepspeed", {"loss_scale_window": "20"}, "burst 200 start=20 length=25")
    assert first["training stopped at step"] == str(trace.stopped_at)

    # Another preset: torch's GradScaler has no floor exception, so the run goes to the end.
    play.locator(".labkit-playground-preset select").select_option("torch")
    page.wait_for_selector(".labkit-playground-option-growth_interval input")
    torch = wait_for_new_summary(page, first)
    assert torch["steps"] == "200" and "training stopped at step" not in torch
    figure_before = play.locator(".labkit-playground-figure").get_attribute("src")

    # An option: a short growth interval lets the scale climb back after the burst.
    box = play.locator(".labkit-playground-option-growth_interval input")
    box.fill("10")
    box.press("Enter")
    fast = wait_for_new_summary(page, torch)
    assert float(fast["final scale"]) > float(torch["final scale"])
    # The figure is its own widget, and may be redrawn just after the summary.
    expect(play.locator(".labkit-playground-figure")).not_to_have_attribute("src", figure_before)

    # The pattern: no overflow at all means nothing is skipped.
    pattern = play.locator(".labkit-playground-pattern input")
    pattern.fill("..........")
    pattern.press("Enter")
    clean = wait_for_new_summary(page, fast)
    assert clean["steps"] == "10" and clean["updates skipped"] == "0"

    # Bad input: a message in the widget, the last good view stays.
    box.fill("minus three")
    box.press("Enter")
    page.wait_for_selector(".labkit-playground-message .labkit-error")
    assert summary(page) == clean
    screenshot(page, "playground_03")


def test_loss_scale_slider_moves_the_histogram(open_notebook):
    page = open_notebook("03_loss_scaling.ipynb")
    explorer = page.locator(".labkit-lossscale").first
    explorer.scroll_into_view_if_needed()
    table = explorer.locator(".labkit-lossscale-table")
    before = table.inner_text()
    src_before = explorer.locator(".labkit-lossscale-figure").get_attribute("src")
    drag(page, explorer.locator(".labkit-lossscale-slider .noUi-handle"), 160)
    page.wait_for_function(
        "(old) => document.querySelector('.labkit-lossscale-table').innerText !== old", arg=before
    )
    expect(explorer.locator(".labkit-lossscale-figure")).not_to_have_attribute("src", src_before)
    screenshot(page, "lossscale_03")
