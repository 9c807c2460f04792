"""How the report writes numbers and names (:mod:`disttrain.report.units`): percent for MFU, SI prefixes for
throughput, binary units for bytes, seconds with sensible digits, readable metric names."""

from __future__ import annotations

import pytest

from disttrain.report.units import axis_scale, fmt, fmt_bytes, fmt_seconds, readable, si, unit_of

pytestmark = pytest.mark.timeout(30)


def test_fractions_of_peak_are_percent() -> None:
    assert fmt(0.661051, "percent") == "66.1%"
    assert fmt(0.010459265938100608, "percent") == "1.05%"
    assert fmt(0.00038, "percent") == "0.038%"


def test_throughput_has_si_prefixes() -> None:
    assert si(31543.33724818028) == "31.5k"
    assert fmt(6444.2210936365955, "per_s") == "6.44k"
    assert fmt(1.2e6, "per_s") == "1.2M"
    assert fmt(999.96, "per_s") == "1k"
    assert fmt(397.05, "per_s") == "397"


def test_bytes_are_binary_units() -> None:
    assert fmt_bytes(348160000) == "332 MiB"
    assert fmt_bytes(1.5 * 2**30) == "1.5 GiB"
    assert fmt_bytes(11741.333) == "11.5 KiB"
    assert fmt_bytes(512) == "512 B"
    assert fmt([348160000, 346755072], "bytes") == "max 332 MiB"  # one value per rank: the largest


def test_seconds_have_sensible_digits() -> None:
    assert fmt_seconds(0.027945108000494656) == "27.9 ms"
    assert fmt_seconds(2.624948263168335) == "2.62 s"
    assert fmt_seconds(125.4) == "2 min 05 s"
    assert fmt_seconds(3720) == "1 h 02 min"
    assert fmt_seconds(4e-5) == "40 µs"


def test_plain_numbers_and_counts() -> None:
    assert fmt(3.645472288131714) == "3.645"
    assert fmt(0.059240857986733314) == "0.05924"
    assert fmt(7) == "7" and fmt(123456) == "123,456" and fmt(8000, "count") == "8,000"
    assert fmt(1.25) == "1.25" and fmt(0.0001, "lr") == "0.0001" and fmt(3e-5, "lr") == "3e-05"
    assert fmt("ddp") == "ddp" and fmt(True) == "True" and fmt(float("nan")) == "nan"


def test_keys_have_readable_names_and_units() -> None:
    assert [readable(k) for k in ("tokens_per_s", "mfu", "step_time_s", "peak_memory_bytes")] == [
        "tokens/s",
        "MFU",
        "step time",
        "peak memory",
    ]
    assert readable("env_steps_per_s") == "env steps/s" and readable("my_custom_metric") == "my custom metric"
    assert readable("queue_wait_s") == "queue wait" and unit_of("queue_wait_s") == "s"
    assert unit_of("mfu") == "percent" and unit_of("samples_per_s") == "per_s" and unit_of("x_bytes") == "bytes"


def test_axes_are_drawn_in_a_unit_that_fits_the_values() -> None:
    assert axis_scale("bytes", 3.4e8) == (2**-20, "MiB")
    assert axis_scale("bytes", 3e10) == (2**-30, "GiB")
    assert axis_scale("s", 0.02) == (1e3, "ms") and axis_scale("s", 4.0) == (1.0, "s")
    assert axis_scale("percent", 0.5) == (100.0, "%") and axis_scale("", 5.0) == (1.0, "")
