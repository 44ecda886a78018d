"""The admin limits refuse values that make no sense, naming the field; the defaults pass.

How: `AdminLimits(...).validate()` on the defaults and on one bad value per rule."""

from __future__ import annotations

import pytest

from logsvc.admin.limits import DEFAULT_ADMIN_LIMITS, AdminLimits


def test_defaults_are_valid() -> None:
    assert DEFAULT_ADMIN_LIMITS.validate() == AdminLimits()


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("request_body_bytes_max", 0),
        ("request_body_bytes_max", 255),  # below the largest valid body
        ("requests_inflight_max", 0),
        ("view_call_s_max", -1.0),
        ("ready_apply_lag_entries_max", -1),
        ("metric_label_values_max", 0),
        ("requests_inflight_max", True),  # a bool is not a count
    ],
)
def test_bad_values_are_refused_by_name(field: str, bad: object) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        AdminLimits(**{field: bad}).validate()  # type: ignore[arg-type]


def test_zero_apply_lag_means_exactly_caught_up() -> None:
    assert AdminLimits(ready_apply_lag_entries_max=0).validate().ready_apply_lag_entries_max == 0
