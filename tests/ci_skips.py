"""Under CI (``CI=true``: .ci/run sets it, as CI services do), a test that skips for want of
something the CI machine is known to provide fails instead: the skip would otherwise pass CI
without the test having run. Registered by tests/conftest.py; docs/testing.md lists what CI
provides and what may still skip there.

The CI machine is a fresh Debian, as root, with the package registries reachable:
scripts/setup.sh installs the venv (dev extras: Playwright) and Fashion-MNIST, and the tests
themselves install Docker (tests/deploy_helpers.py) and chromium (tests/browser_page.py). What
it may lack, and may still skip for: a GPU, arm64 emulation (binfmt_misc in a container), the
CIFAR-10 copy, iproute2's ``ss``, systemd-analyze.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

CI_PROVIDES: dict[str, tuple[str, ...]] = {
    "Docker (installed and started by the tests as root)": ("no running Docker engine",),
    "a browser (Playwright, pyproject's dev extras; chromium installed by the tests)": (
        "pip install playwright",),
    "root": ("as root only",),
    "scripts/setup.sh (run first by .ci/run)": ("scripts/setup.sh has not run",),
    "Fashion-MNIST (scripts/setup.sh's apt data package)": ("Fashion-MNIST not at",),
}
"""What the CI machine provides, and the skip reasons (substrings) that say it is missing.
tests/test_ci_skips.py checks each substring is still a reason some test skips with."""


def needed_for(reason: str) -> str | None:
    """The CI-provided capability a skip ``reason`` says is missing, or None."""
    for capability, phrases in CI_PROVIDES.items():
        if any(p in reason for p in phrases):
            return capability
    return None


def skip_reason(report: pytest.TestReport) -> str:
    """A skip report's reason ("Skipped: " taken off)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[None]:
    """Under CI, a skip for want of a CI-provided capability becomes a failure."""
    del item, call
    report: pytest.TestReport = yield
    if (report.skipped and os.environ.get("CI") == "true"
            and not hasattr(report, "wasxfail")):
        reason = skip_reason(report)
        need = needed_for(reason)
        if need is not None:
            report.outcome = "failed"
            report.longrepr = (f"CI must run this test, but it skipped for want of {need}: "
                               f"{reason!r} (tests/ci_skips.py, docs/testing.md)")
    return report
