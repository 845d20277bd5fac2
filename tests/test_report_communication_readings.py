"""The communication sentences of the Flower tutorial read the history rows they are given."""
from pflkit.report import readings


def _rows(rounds, clients, down, up, failed=()):
    return [{"round": r + 1, "clients": clients, "bytes_down": clients * down, "bytes_up": clients * up,
             "failed": list(failed) if r == 0 else []} for r in range(rounds)]


HISTORY = {"Global": _rows(4, 5, 400, 400), "FT (BN C)": [], "FedL2P": _rows(2, 4, 1000, 600, failed=[3])}


def test_reading_gives_per_client_bytes_and_totals():
    text = readings.communication_reading(HISTORY)
    assert "**Global**: 4 rounds of 5 clients; per client and round 0.4 kB down (100 float32 values)" in text
    assert "0.02 MB in all" in text  # Global: 4 rounds * 5 clients * 800 B = 16,000 B
    assert "**FedL2P**: 2 rounds of 4 clients; per client and round 1.0 kB down" in text
    assert "FT (BN C)" not in text  # a stage without rounds sent nothing and is not listed


def test_takeaway_compares_with_global():
    text = readings.communication_takeaway(HISTORY)
    # FedL2P: 2 * 4 * 1600 = 12,800 B = 80% of Global's 16,000 B; 1600 / 800 = 2.0x per client and round
    assert "FedL2P sent 0.01 MB in 2 rounds (80% of Global's 0.02 MB in 4), 2.0x Global's bytes" in text


def test_failed_clients_are_collected_over_stages():
    assert readings.failed_clients(HISTORY) == [3]
    assert readings.failed_clients({"Global": _rows(3, 2, 1, 1)}) == []


def test_takeaway_without_a_comparison_falls_back_to_the_bullets():
    only = {"Global": _rows(4, 5, 400, 400)}
    assert readings.communication_takeaway(only) == readings.communication_reading(only)
    assert readings.communication_takeaway({"FT (BN C)": []}) == "- No stage of this run has federated rounds."


def test_signed_never_prints_negative_zero():
    from pflkit.report.readings import signed

    assert [signed(-0.04), signed(0.04), signed(-0.06), signed(2.25, 2)] == ["+0.0", "+0.0", "-0.1", "+2.25"]
