"""pytest hooks shared by the Python tests."""


def pytest_terminal_summary(terminalreporter):
    """Skips as one line per reason, and the bad-input suite's size."""
    reasons = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reasons[reason] = reasons.get(reason, 0) + 1
    for reason, count in sorted(reasons.items()):
        terminalreporter.write_line(f"skipped {count}: {reason.removeprefix('Skipped: ')}")
    try:
        from test_bad_input import BAD_INPUT_CLASSES
    except ImportError:
        return
    passed = [r for r in terminalreporter.stats.get("passed", []) if "test_bad_input" in r.nodeid]
    failed = [r for r in terminalreporter.stats.get("failed", []) if "test_bad_input" in r.nodeid]
    if not passed and not failed:  # the suite was not selected
        return
    terminalreporter.write_line(
        f"bad-input suite: {len(passed)} of {BAD_INPUT_CLASSES} distinct classes passed")
