"""pytest hooks shared by the Python tests."""


def pytest_terminal_summary(terminalreporter):
    """The bad-input suite's size in the run's summary (its issue asks for the count)."""
    try:
        from test_bad_input import BAD_INPUT_CLASSES
    except ImportError:
        return
    passed = [r for r in terminalreporter.stats.get("passed", []) if "test_bad_input" in r.nodeid]
    terminalreporter.write_line(
        f"bad-input suite: {len(passed)} of {BAD_INPUT_CLASSES} distinct classes passed")
