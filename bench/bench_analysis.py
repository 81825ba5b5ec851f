"""Benchmark of the happens-before hazard analyses (not a test).

Synthetic traces of 10^4 .. 10^6 records on 8 streams, shaped like multi-stream inference:
each stream computes on its own activations (32 blocks, a fifth of the reads through
slices) and 64 shared weights; streams hand fresh tensors to each other (record, wait,
consume, record_stream, free; 1% forget the wait or the record_stream); activations are
replaced with address reuse; occasional joins and a host sync every 20,000 records.
Prints wall and CPU time of ``analyze`` (our kinds), the CPU split per analysis, and the
peak memory tracemalloc sees during ``analyze``, per size.

    PYTHONPATH=src python bench/bench_analysis.py [--sizes 10000,100000,1000000] [--no-memory]
"""
from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc

from pytest_npugraph import trace as T
from pytest_npugraph.analysis import analyze, events, happens_before, races, record_stream

STREAMS = 8
WEIGHTS = 64
ACTIVATIONS = 32   # per stream
SIZE = 4096
MY_KINDS = ("race", "missing-record-stream", "event-misuse")


def synthetic(n: int, seed: int = 0, bug_rate: float = 0.01) -> T.Trace:
    """Mostly correct multi-stream code; ``bug_rate`` of the hand-overs forget their sync."""
    rng = random.Random(seed)
    tr = T.Trace()
    recs = tr.records
    sites = [T.Site("model.py", line) for line in range(1, 400)]
    for s in range(STREAMS):
        tr.streams[s] = T.StreamInfo(s, 0, s, f"npu:0/stream-{s}")
    for e in range(STREAMS * 2):
        tr.events[e] = T.EventInfo(e, f"Event#{e}", sites[0])
    next_bid, top = 0, 0
    freed = {s: [] for s in range(STREAMS)}   # addresses free for reuse on each stream

    def site():
        return sites[len(recs) % len(sites)]

    def alloc(stream):
        nonlocal next_bid, top
        reuses = None
        if freed[stream] and rng.random() < 0.9:
            lo, reuses = freed[stream].pop(rng.randrange(len(freed[stream])))
        else:
            lo, top = top, top + SIZE
        bid = next_bid
        next_bid += 1
        tr.blocks[bid] = T.BlockInfo(bid, 0, stream, lo, lo + SIZE, SIZE, site())
        recs.append(T.Alloc(len(recs), bid, tr.blocks[bid].site, reuses))
        return T.Span(0, lo, lo + SIZE, bid)

    def free(stream, span):
        recs.append(T.Free(len(recs), span.block, site()))
        freed[stream].append((span.lo, span.block))

    weights = [alloc(0) for _ in range(WEIGHTS)]
    live = {s: [alloc(s) for _ in range(ACTIVATIONS)] for s in range(STREAMS)}
    while len(recs) < n:
        s = rng.randrange(STREAMS)
        roll = rng.random()
        act = live[s]
        if roll < 0.80:   # compute on the stream's own activations, some through a slice
            a, b = rng.sample(range(len(act)), 2)
            view = act[a]
            if rng.random() < 0.2:
                half = rng.choice((0, SIZE // 2))
                view = T.Span(0, view.lo + half, view.lo + half + SIZE // 2, view.block)
            recs.append(T.Kernel(len(recs), s, "aten::op", (view, rng.choice(weights)), (act[b],), site()))
        elif roll < 0.95:  # hand a fresh tensor to another stream through an event
            t = (s + 1 + rng.randrange(STREAMS - 1)) % STREAMS
            out = alloc(s)
            recs.append(T.Kernel(len(recs), s, "aten::produce", (rng.choice(act),), (out,), site()))
            recs.append(T.EventRecord(len(recs), s, 2 * s, site()))
            if rng.random() >= bug_rate:
                recs.append(T.EventWait(len(recs), t, 2 * s, site()))
            recs.append(T.Kernel(len(recs), t, "aten::consume", (out,), (rng.choice(live[t]),), site()))
            if rng.random() >= bug_rate:
                recs.append(T.RecordStream(len(recs), out.block, t, site()))
            free(s, out)
        elif roll < 0.98:  # replace one activation (same-stream reuse)
            i = rng.randrange(len(act))
            free(s, act[i])
            act[i] = alloc(s)
        elif roll < 0.995:  # join another stream
            t = rng.randrange(STREAMS)
            recs.append(T.EventRecord(len(recs), t, 2 * t + 1, site()))
            recs.append(T.EventWait(len(recs), s, 2 * t + 1, site()))
        elif len(recs) % 20_000 < 100:
            recs.append(T.HostSync(len(recs), "device", 0, site=site()))
    del recs[n:]
    return tr


def timed(fn, *args):
    """(wall seconds, CPU seconds, result): CPU time stays meaningful on a busy machine."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def peak_memory(fn, *args) -> int:
    gc.collect()
    tracemalloc.start()
    fn(*args)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def parts(trace):
    cache: dict = {}
    out = {}
    for name, fn in (("hb", happens_before.of), ("races", races.find),
                     ("record_stream", record_stream.find), ("events", events.find)):
        out[name] = timed(fn, trace, cache)[1]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--no-memory", action="store_true", help="skip the (slow) tracemalloc run")
    args = ap.parse_args(argv)
    print(f"{'records':>9} {'kernels':>8} {'wall s':>7} {'cpu s':>6} {'cpu us/rec':>10} {'hb':>5} "
          f"{'races':>5} {'rec_str':>7} {'events':>6} {'hazards':>7} {'peak MiB':>8}   (split: cpu s)")
    for n in (int(x) for x in args.sizes.split(",")):
        tr = synthetic(n)
        kernels = sum(1 for r in tr.records if type(r) is T.Kernel)
        wall, cpu, hazards = timed(analyze, tr, MY_KINDS)
        split = parts(tr)
        peak = "-" if args.no_memory else f"{peak_memory(analyze, tr, MY_KINDS) / 2**20:.1f}"
        print(f"{n:>9} {kernels:>8} {wall:>7.2f} {cpu:>6.2f} {cpu / n * 1e6:>10.2f} {split['hb']:>5.2f} "
              f"{split['races']:>5.2f} {split['record_stream']:>7.2f} {split['events']:>6.2f} "
              f"{len(hazards):>7} {peak:>8}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
