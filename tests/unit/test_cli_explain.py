"""``lakeshore queues explain``'s line of a wait_target decision's estimates."""

from __future__ import annotations

from lakeshore.cli.feed import _estimates


def test_each_estimate_with_its_source() -> None:
    estimates = {
        "service_s": {"value": 45.0, "source": "hint"},
        "boot_s": {"value": 90.0, "source": "learned", "samples": 3},
        "arrivals_per_s": {"value": 0.02, "source": "learned"},
        "due_soon": 2,
    }
    assert _estimates(estimates) == (
        "service_s 45.0 (hint), boot_s 90.0 (learned), arrivals_per_s 0.02 (learned), due_soon 2"
    )
