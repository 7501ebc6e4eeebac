"""`toolfault bench --stores` reports per-store throughput against a bare call."""

from __future__ import annotations

import json
from typing import Any

from toolfault_cli._cli import main


def test_stores_json_has_a_row_per_store_with_ratios(capsys: Any, redis_url: str) -> None:
    """Each store's row carries calls/s and a ratio to the bare call measured in the same run."""
    assert main(["bench", "--stores", "--json", "--redis-url", redis_url]) == 0
    rows = {row["store"]: row for row in json.loads(capsys.readouterr().out)["stores"]}
    assert set(rows) == {"bare", "memory", "sqlite", "redis"}
    assert rows["bare"]["ratio_vs_bare"] == 1.0
    for name in ("memory", "sqlite", "redis"):
        assert 0 < rows[name]["ratio_vs_bare"] < 1
        assert rows[name]["calls_per_second"] > 0
