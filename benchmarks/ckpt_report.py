"""The tables and figures of bench_checkpoint.py, from the ranks' raw timings: parts 1-2 (``report_saves``)
and part 3 (``report_steps``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks import _common as C

GOAL_BLOCKED = 0.10
GOAL_THROUGHPUT = 0.50
GOAL_OVERHEAD = 0.02
MB = 1e6


def mount_of(path: Path) -> str:
    """'device (fstype) on mountpoint' for the file system holding ``path``."""
    best = ("?", "?", "/")
    for line in Path("/proc/mounts").read_text().splitlines():
        dev, mnt, fstype = line.split()[:3]
        inside = str(path.resolve()).startswith(mnt.rstrip("/") + "/") or str(path.resolve()) == mnt
        if inside and len(mnt) >= len(best[2]):
            best = (dev, fstype, mnt)
    return f"{best[0]} ({best[1]}) on {best[2]}"


def slowest(ranks: list[dict[str, Any]], name: str, *keys: str) -> list[float]:
    """Per round, the largest value over ranks (the slowest rank sets the pace) of the sum of ``keys``."""
    per_rank = [r["saves"]["rounds"][name] for r in ranks]
    return [max(sum(rr[i].get(k, 0.0) for k in keys) for rr in per_rank) for i in range(len(per_rank[0]))]


# -- part 1: blocked time per save --------------------------------------------------------------------
def blocked_figures(
    ranks: list[dict[str, Any]], mode: str, sync: list[float], plain_step: list[float]
) -> tuple[dict[str, Any], float]:
    """The figures of one async mode against the sync save, and the ratio of its time in save() alone."""
    name = f"save {mode}"
    blocked = slowest(ranks, name, "blocked_s", "staging_wait_s")  # save() + wait before the optimizer step
    in_save = slowest(ranks, name, "blocked_s")
    waited = slowest(ranks, name, "staging_wait_s")
    step = slowest(ranks, name, "step_s")
    total = slowest(ranks, name, "total_s")
    ratio = C.paired_ratio(blocked, sync)
    lo, hi = C.spread([b / s for b, s in zip(blocked, sync, strict=True)])
    # the copy runs on another thread of the same rank: on 2 cores for 2 ranks it takes CPU from the step
    slowed = [a - w - p for a, w, p in zip(step, waited, plain_step, strict=True)]  # the wait is counted above
    figures = {
        "ratio": ratio,
        "iqr": [lo, hi],
        "blocked_ms_median": C.median(blocked) * 1e3,
        "in_save_ms_median": C.median(in_save) * 1e3,
        "staging_wait_ms_median": C.median(waited) * 1e3,
        "step_after_save_minus_plain_step_ms_median": C.median(slowed) * 1e3,
        "step_after_save_minus_plain_step_over_sync": C.paired_ratio(slowed, sync),
        "until_committed_ms_median": C.median(total) * 1e3,
        "goal": GOAL_BLOCKED,
        "verdict": C.verdict(ratio, GOAL_BLOCKED, higher_is_better=False),
    }
    return figures, C.paired_ratio(in_save, sync)


def blocked_rows(mode: str, f: dict[str, Any], in_save_ratio: float) -> list[list[Any]]:
    lo, hi = f["iqr"]
    return [
        [
            f"async {mode}",
            f["blocked_ms_median"],
            f["until_committed_ms_median"],
            f["ratio"],
            f"[{lo:.3f}, {hi:.3f}]",
            f"<= {GOAL_BLOCKED} {f['verdict']}",
        ],
        ["  in save()", f["in_save_ms_median"], "", in_save_ratio, "", ""],
        ["  waiting for the copy before the next optimizer step", f["staging_wait_ms_median"], "", "", "", ""],
        [
            "  (not blocked) next step's extra time: the copy shares the core",
            f["step_after_save_minus_plain_step_ms_median"],
            "",
            f["step_after_save_minus_plain_step_over_sync"],
            "",
            "",
        ],
    ]


def diagnostics(ranks: list[dict[str, Any]], sync: list[float], figures: dict[str, Any]) -> list[list[Any]]:
    """Rows (and ``figures``) of what a sync save is made of: dcp.save alone, the CRC32 pass, the staging copy."""
    raw = slowest(ranks, "dcp.save (no manager)", "total_s")
    crc = [r.get("crc32_s", 0.0) for r in ranks[0]["saves"]["rounds"]["save off"]]
    figures["sync_save_ms_median"] = C.median(sync) * 1e3
    figures["raw_dcp_save_over_sync"] = C.paired_ratio(raw, sync)
    figures["crc32_over_sync"] = C.paired_ratio(crc, sync)
    rows = [
        ["  dcp.save alone (no manager)", C.median(raw) * 1e3, "", C.paired_ratio(raw, sync), "", ""],
        [
            "  a CRC32 pass over the files (now in the writers)",
            C.median(crc) * 1e3,
            "",
            C.paired_ratio(crc, sync),
            "",
            "",
        ],
    ]
    for reuse in ("fresh", "reused"):
        st = slowest(ranks, f"staging, {reuse} buffers", "total_s")
        figures[f"staging_{reuse}_buffers_over_sync"] = C.paired_ratio(st, sync)
        figures[f"staging_{reuse}_buffers_ms_median"] = C.median(st) * 1e3
        label = "  state_dict + staging copy, " + ("new buffers (DCP)" if reuse == "fresh" else "buffers reused")
        rows.append([label, C.median(st) * 1e3, "", C.paired_ratio(st, sync), "", ""])
    return rows


def print_blocked(rows: list[list[Any]], args: argparse.Namespace, s0: dict[str, Any]) -> None:
    C.table(
        ["save", "loop blocked ms", "until committed ms", "ratio to sync", "IQR", "goal"],
        rows,
        title=(
            f"\n1. Training loop blocked per save: {args.nproc} ranks ({s0['strategy']}), GPT "
            f"{args.big_layers}x{args.big_width} = {s0['params'] / 1e6:.1f}M params + AdamW, "
            f"{s0['checkpoint_bytes'] / MB:.0f} MB per checkpoint; slowest rank per round; ratio = median over "
            f"{args.rounds} rounds of blocked / sync save time of the same round;\nasync blocked = time in save() "
            "+ time the next training step waits for the background copy before its optimizer step; until "
            "committed includes that step"
        ),
    )


# -- part 2: throughput -------------------------------------------------------------------------------
def throughput(ranks: list[dict[str, Any]], sync: list[float], nbytes: int) -> dict[str, Any]:
    """Save and load speeds (MB/s of checkpoint bytes) against plain Python writes and reads, and their ratios."""
    write_shares = slowest(ranks, "plain write (per rank)", "total_s")
    write_whole = slowest(ranks, "plain write (1 file)", "total_s")
    write_new = slowest(ranks, "plain write (per rank, new file)", "total_s")
    write_best = [min(a, b) for a, b in zip(write_shares, write_whole, strict=True)]
    read_shares = slowest(ranks, "plain read (per rank)", "total_s")
    read_one = slowest(ranks, "plain read (1 file)", "total_s")
    read_all_ranks = slowest(ranks, "plain read (every rank all)", "total_s")
    read_best = [min(a, b) for a, b in zip(read_shares, read_one, strict=True)]
    load_cold = slowest(ranks, "load (cold)", "total_s")
    load_dcp = slowest(ranks, "load, DCP's reader (cold)", "total_s")
    raw_save = slowest(ranks, "dcp.save (no manager)", "total_s")
    save_ratio = C.paired_ratio(write_best, sync)  # (bytes/sync) / (bytes/plain) = plain / sync
    load_ratio = C.paired_ratio(read_best, load_cold)

    def mbps(ts: list[float]) -> float:
        return nbytes / MB / C.median(ts)

    return {
        "save_MBps": mbps(sync),
        "plain_write_per_rank_MBps": mbps(write_shares),
        "plain_write_one_file_MBps": mbps(write_whole),
        "save_over_plain_write": save_ratio,
        "save_over_plain_write_per_rank": C.paired_ratio(write_shares, sync),
        "plain_write_new_file_MBps": mbps(write_new),
        "save_over_plain_write_new_file": C.paired_ratio(write_new, sync),
        "load_cold_MBps": mbps(load_cold),
        "load_warm_MBps": mbps(slowest(ranks, "load (warm)", "total_s")),
        "plain_read_per_rank_cold_MBps": mbps(read_shares),
        "plain_read_one_file_cold_MBps": mbps(read_one),
        "plain_read_every_rank_all_cold_MBps": mbps(read_all_ranks),
        "load_over_plain_read_every_rank_all": C.paired_ratio(read_all_ranks, load_cold),
        "load_over_plain_read": load_ratio,
        "load_dcp_reader_cold_MBps": mbps(load_dcp),
        "load_dcp_reader_over_plain_read": C.paired_ratio(read_best, load_dcp),
        "raw_dcp_save_MBps": mbps(raw_save),
        "raw_dcp_save_over_plain_write": C.paired_ratio(write_best, raw_save),
        "goal": GOAL_THROUGHPUT,
        "verdict_save": C.verdict(save_ratio, GOAL_THROUGHPUT),
        "verdict_load": C.verdict(load_ratio, GOAL_THROUGHPUT),
    }


def print_throughput(t: dict[str, Any], nbytes: int) -> None:
    C.table(
        ["", "checkpoint MB/s", "plain Python MB/s", "ratio", "goal"],
        [
            [
                "save (sync, incl. commit)",
                t["save_MBps"],
                f"{t['plain_write_per_rank_MBps']:.0f} per rank / {t['plain_write_one_file_MBps']:.0f} 1 file",
                t["save_over_plain_write"],
                f">= {GOAL_THROUGHPUT} {t['verdict_save']}",
            ],
            [
                "load (cold page cache)",
                t["load_cold_MBps"],
                f"{t['plain_read_per_rank_cold_MBps']:.0f} per rank / {t['plain_read_one_file_cold_MBps']:.0f} 1 file",
                t["load_over_plain_read"],
                f">= {GOAL_THROUGHPUT} {t['verdict_load']}",
            ],
            [
                "  (plain: each rank a new file each time, buffered)",
                "",
                f"{t['plain_write_new_file_MBps']:.0f} per rank",
                t["save_over_plain_write_new_file"],
                "",
            ],
            ["load (warm page cache)", t["load_warm_MBps"], "", "", ""],
            [
                "  dcp.save alone (DCP's writer, no manager)",
                t["raw_dcp_save_MBps"],
                "",
                t["raw_dcp_save_over_plain_write"],
                "",
            ],
            [
                "  load with DCP's reader (cold)",
                t["load_dcp_reader_cold_MBps"],
                "",
                t["load_dcp_reader_over_plain_read"],
                "",
            ],
            [
                "  (DDP: every rank needs all bytes)",
                "",
                f"{t['plain_read_every_rank_all_cold_MBps']:.0f} every rank all",
                t["load_over_plain_read_every_rank_all"],
                "",
            ],
        ],
        title=(
            f"\n2. Throughput: {nbytes / MB:.0f} MB of checkpoint files; plain Python = write + fsync the same "
            "bytes (each rank its share, concurrently; or rank 0 one file) and read them back cold; MB/s = "
            "checkpoint bytes / time of the slowest rank;\nratio = median over rounds of checkpoint speed / "
            "plain speed (the faster of the two plain variants) of the same round"
        ),
    )


def report_saves(ranks: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Parts 1 and 2: print their tables, return their figures."""
    s0 = ranks[0]["saves"]
    nbytes = s0["checkpoint_bytes"]
    sync = slowest(ranks, "save off", "blocked_s")
    figures: dict[str, Any] = {
        "params": s0["params"],
        "strategy": s0["strategy"],
        "checkpoint_bytes": nbytes,
        "file_sizes": s0["file_sizes"],
    }
    rows = [["sync save (async_mode=off)", C.median(sync) * 1e3, C.median(sync) * 1e3, 1.0, "", ""]]
    plain_step = slowest(ranks, "train step", "total_s")
    for mode in ("thread", "process"):
        f, in_save_ratio = blocked_figures(ranks, mode, sync, plain_step)
        figures[f"blocked_over_sync_{mode}"] = f
        rows += blocked_rows(mode, f, in_save_ratio)
    rows += diagnostics(ranks, sync, figures)
    print_blocked(rows, args, s0)
    figures["throughput"] = throughput(ranks, sync, nbytes)
    print_throughput(figures["throughput"], nbytes)
    return figures


# -- part 3: step-time overhead -----------------------------------------------------------------------
def step_figures(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Part 3's figures: checkpointed vs plain blocks, slowest rank per block, paired over rounds."""
    times = C.slowest_per_round([r["steps"]["times_s_per_step"] for r in ranks])
    names = list(times)
    plain, ck = times[names[0]], times[names[1]]
    overhead = C.paired_ratio(ck, plain) - 1
    lo, hi = C.spread([c / p - 1 for c, p in zip(ck, plain, strict=True)])
    blocked = [max(r["steps"]["blocked_s_per_block"][i] for r in ranks) for i in range(len(plain))]
    steps = ranks[0]["steps"]["block_steps"]
    # The part of the overhead that is the loop waiting in save() (the rest: the background write
    # competing with the ranks for the 2 cores): per round, blocked time of its saves / no-ckpt block time.
    blocked_share = C.median([blocked[r] / (plain[r] * steps) for r in range(len(plain))])
    # CPU time of both ranks (every thread) per block: far less sensitive to outside load than wall time.
    cpu = {n: [sum(r["steps"]["cpu_s_per_block"][n][i] for r in ranks) for i in range(len(plain))] for n in names}
    cpu_overhead = C.paired_ratio(cpu[names[1]], cpu[names[0]]) - 1
    clo, chi = C.spread([c / p - 1 for c, p in zip(cpu[names[1]], cpu[names[0]], strict=True)])
    return {
        "overhead": overhead,
        "iqr": [lo, hi],
        "ms_per_step": {n: C.median(times[n]) * 1e3 for n in names},
        "blocked_ms_per_block_median": C.median(blocked) * 1e3,
        "blocked_share_of_block_time": blocked_share,
        "cpu_time_overhead": cpu_overhead,
        "cpu_time_overhead_iqr": [clo, chi],
        "cpu_s_per_block": cpu,
        "failures": ranks[0]["steps"]["failures"],
        "goal": GOAL_OVERHEAD,
        "verdict": C.verdict(overhead, GOAL_OVERHEAD, higher_is_better=False),
        "times_s_per_step": times,
    }


def report_steps(ranks: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Part 3: print its table, return its figures."""
    f = step_figures(ranks)
    s0 = ranks[0]["steps"]
    (plain, plain_ms), (ckpt, ckpt_ms) = f["ms_per_step"].items()
    lo, hi = f["iqr"]
    clo, chi = f["cpu_time_overhead_iqr"]
    C.table(
        ["variant", "ms/step (median)", "overhead", "IQR", "goal"],
        [
            [plain, plain_ms, "", "", ""],
            [
                ckpt,
                ckpt_ms,
                f"{f['overhead'] * 100:+.2f}%",
                f"[{lo * 100:+.2f}%, {hi * 100:+.2f}%]",
                f"<= {GOAL_OVERHEAD * 100:.0f}% {f['verdict']}",
            ],
            ["  of which the loop blocked in save()", "", f"{f['blocked_share_of_block_time'] * 100:+.2f}%", "", ""],
            [
                "  CPU time of the ranks (all threads)",
                "",
                f"{f['cpu_time_overhead'] * 100:+.2f}%",
                f"[{clo * 100:+.2f}%, {chi * 100:+.2f}%]",
                "",
            ],
        ],
        title=(
            f"\n3. Step-time overhead: Trainer.fit(), {args.nproc} ranks, GPT {args.layers}x{args.width} ctx "
            f"{args.context} ({s0['params'] / 1e6:.1f}M params) micro-batch {args.micro_batch} bf16; "
            f"one Trainer, blocks of {s0['block_steps']} steps alternating with and without its CheckpointManager: "
            f"{args.saves_per_block} async save(s) per block (every {args.interval} steps)\n+ waiting for it to "
            "commit at the block's end; slowest rank per block; "
            f"overhead = median over {args.step_rounds} rounds of (ckpt block time / no-ckpt block time) - 1. "
            f"Loop blocked in save(): median {f['blocked_ms_per_block_median']:.1f} ms per block "
            f"({s0['saves_timed']} timed saves)"
        ),
    )
    return f
