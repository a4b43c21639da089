"""bench.data_path --repeat: the summary's medians, spreads and ratios (what RESULTS.md quotes)."""
from bench.data_path import summarize


def row(mode, n, rate):
    return {"mode": mode, "n": n, "records_per_s": rate}


def test_medians_spread_and_the_ratio_of_medians():
    rows = [row("plain", 1, 100.0), row("herd", 1, 80.0), row("plain", 1, 300.0), row("herd", 1, 95.0),
            row("plain", 1, 200.0), row("herd", 1, 190.0), row("herd-messages", 1, 210.0),
            row("plain", 4, 50.0), row("herd", 4, None)]
    out = {(x["mode"], x["n"]): x for x in summarize(rows)}
    assert out[("plain", 1)]["median_records_per_s"] == 200.0
    assert (out[("plain", 1)]["min_records_per_s"], out[("plain", 1)]["max_records_per_s"]) == (100.0, 300.0)
    assert out[("herd", 1)]["runs"] == 3 and out[("herd", 1)]["vs_plain_median"] == 0.475
    assert out[("herd-messages", 1)]["vs_plain_median"] == 1.05
    assert ("herd", 4) not in out  # a cell without a rate is not summarized
    assert "vs_plain_median" not in out[("plain", 4)]
