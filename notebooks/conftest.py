"""nbval settings: what a stored notebook output is compared on."""


def pytest_collectstart(collector):
    # A widget's stored view is a model id that changes on every run; the widget's
    # behaviour is tested in tests/ and in the browser test, not here.
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("application/vnd.jupyter.widget-view+json",)
