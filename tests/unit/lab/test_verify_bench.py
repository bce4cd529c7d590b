"""`make bench-verify` end to end on a small model: every shape is verified (a wrong digest would
stop the bench), the page-cache reader and the O_DIRECT reader are both measured, figures add up."""

from __future__ import annotations

import json
from pathlib import Path

from atlaslab.benchmarks import verify as verify_bench


def test_bench_measures_every_shape_with_both_readers(tmp_path: Path, monkeypatch, capsys) -> None:
    # only the bench's own files leave the page cache: a unit test must not drop the machine's
    monkeypatch.setattr(verify_bench, "drop_cache", verify_bench.evict)
    monkeypatch.setattr(verify_bench, "TARGET_SHARD", 12 << 20)
    monkeypatch.setattr(verify_bench, "RANDOM_BLOCK", 4 << 20)
    monkeypatch.setattr(verify_bench, "SHAPES", {"mixed": [1, 4 << 10, (4 << 20) + 1, 9 << 20], "small": [512] * 30})
    assert verify_bench.main(["--size-gib", str(30 / 1024), "--dir", str(tmp_path), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["files"] == 4  # three 10 MiB shards and config.json
    assert figures["buffered_s"] > 0 and figures["verifier_s"] > 0
    shapes = {s["name"]: s for s in figures["shapes"]}
    assert set(shapes) == {"mixed", "small", "one large file"}
    assert shapes["small"]["files"] == 30 and shapes["small"]["bytes"] == 30 * 512
    assert shapes["one large file"]["files"] == 1 and shapes["one large file"]["bytes"] == 10 << 20
    assert all(s["direct_mb_s"] > 0 and s["buffered_mb_s"] > 0 for s in shapes.values())
    # each figure has a ceiling measured beside it: the capacity, or for one file md5 on one core
    assert figures["capacity_beside_mb_s"] > 0 and figures["md5_1_mb_s"] > 0
    assert all(s["ceiling_mb_s"] > 0 and s["hash_cpu_s_per_gb"] > 0 for s in shapes.values())
    assert figures["hash_cpu_beside_s_per_gb"] > 0
    # which ceiling, by name (the rule is tested below with fixed capacities): the figures are measurements a
    # second apart on shared cores, so either may be the lower one in this run
    assert shapes["mixed"]["ceiling_of"] == shapes["small"]["ceiling_of"] == "capacity"
    assert shapes["one large file"]["ceiling_of"] in (verify_bench.ONE_FILE_CEILING, "capacity")
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "the generated data is removed"
    text = verify_bench.render(verify_bench.Figures(**figures))
    assert "through the page cache" in text and "one large file" in text and "many" not in text
    goal = [line for line in text.splitlines() if line.endswith(("PASS", "MISSED"))]
    assert len(goal) == 4, goal  # the model and the three shapes


def test_a_figure_passes_at_90_percent_of_its_ceiling_and_not_below() -> None:
    assert verify_bench.goal_line("x", 621, 690, "capacity").endswith(" 90.0 %  PASS")
    assert verify_bench.goal_line("x", 620, 690, "capacity").endswith(" 89.9 %  MISSED")
    assert verify_bench.goal_line("x", 500, 0, "capacity").endswith("MISSED")
    assert verify_bench.goal_line("x", 621, 690, "capacity", 0.9).endswith(" 90.0 %  (CPU  90 %)  PASS")


def test_one_files_ceiling_is_md5_on_one_core_unless_the_capacity_is_lower(monkeypatch) -> None:
    def capacity(md5_1, both):
        return lambda workers, seconds=2.0, algorithms=("md5", "sha256"): (
            (md5_1, 2.0) if algorithms == ("md5",) else (both, 3.0))
    monkeypatch.setattr(verify_bench, "hash_capacity", capacity(674, 854))
    assert verify_bench.one_file_ceiling(2) == (674, 3.0, verify_bench.ONE_FILE_CEILING)
    monkeypatch.setattr(verify_bench, "hash_capacity", capacity(700, 650))  # a loaded machine's capacity
    assert verify_bench.one_file_ceiling(2) == (650, 3.0, "capacity")
