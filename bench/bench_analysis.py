"""Benchmark of the happens-before hazard analyses (not a test).

Synthetic traces of 10^4 .. 10^6 records on 8 streams, shaped like multi-stream inference:
each stream works on its own activations (a few dozen blocks, some through partial views),
all streams read shared weights, streams hand results to each other through events
(record every few ops, waits on other streams' records, occasional wait_stream), some
activations are freed and their address reused (half with record_stream), and a host
sync every 20,000 records.  Prints time and peak traced memory of ``analyze`` per size.

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


def synthetic(n: int, seed: int = 0) -> T.Trace:
    rng = random.Random(seed)
    tr = T.Trace()
    recs = tr.records
    sites = [T.Site("model.py", line) for line in range(1, 400)]
    for s in range(STREAMS):
        tr.streams[s] = T.StreamInfo(s, 0, s, f"npu:0/stream-{s}")
    for e in range(STREAMS * 4):
        tr.events[e] = T.EventInfo(e, f"Event#{e}", sites[0])
    next_bid, top = 0, 0
    live = {}      # stream -> list of live block spans
    reused = []    # freed blocks awaiting reuse: (bid, stream, lo)

    def alloc(stream, lo=None, reuses=None):
        nonlocal next_bid, top
        if lo is None:
            lo, top = top, top + SIZE
        bid = next_bid
        next_bid += 1
        tr.blocks[bid] = T.BlockInfo(bid, 0, stream, lo, lo + SIZE, SIZE, rng.choice(sites))
        recs.append(T.Alloc(len(recs), bid, tr.blocks[bid].site, reuses))
        return T.Span(0, lo, lo + SIZE, bid)

    weights = [alloc(0) for _ in range(WEIGHTS)]
    for s in range(STREAMS):
        live[s] = [alloc(s) for _ in range(ACTIVATIONS)]
    last_event = {}   # stream -> the event it recorded last
    while len(recs) < n:
        seq = len(recs)
        s = rng.randrange(STREAMS)
        roll = rng.random()
        site = sites[seq % len(sites)]
        if roll < 0.70:
            act = live[s]
            a, b = rng.sample(range(len(act)), 2)
            view = act[a]
            if rng.random() < 0.2:   # a slice of the activation
                half = rng.choice((0, SIZE // 2))
                view = T.Span(0, view.lo + half, view.lo + half + SIZE // 2, view.block)
            recs.append(T.Kernel(seq, s, "aten::op", (view, rng.choice(weights)), (act[b],), site))
        elif roll < 0.80:
            e = s * 4 + rng.randrange(4)
            last_event[s] = e
            recs.append(T.EventRecord(seq, s, e, site))
        elif roll < 0.90:
            other = rng.randrange(STREAMS)
            if other in last_event and other != s:
                recs.append(T.EventWait(seq, s, last_event[other], site))
                # consume one of the other stream's activations now ordered before us
                recs.append(T.Kernel(len(recs), s, "aten::consume", (rng.choice(live[other]),),
                                     (rng.choice(live[s]),), site))
        elif roll < 0.97:
            act = live[s]
            i = rng.randrange(len(act))
            old = act[i]
            if rng.random() < 0.5:
                recs.append(T.RecordStream(seq, old.block, (s + 1) % STREAMS, site))
            recs.append(T.Free(len(recs), old.block, site))
            act[i] = alloc(s, old.lo, old.block)
        elif roll < 0.99:
            other = (s + 1) % STREAMS
            e = other * 4 + 3
            recs.append(T.EventRecord(seq, other, e, site))
            recs.append(T.EventWait(seq + 1, s, e, site))
        elif seq % 20_000 < 200:
            recs.append(T.HostSync(seq, "device", 0, site=site))
    del recs[n:]
    return tr


def timed(fn, *args):
    gc.collect()
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


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
        out[name], _ = timed(fn, trace, cache)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--no-memory", action="store_true", help="skip the (slow) tracemalloc run")
    args = ap.parse_args(argv)
    print(f"{'records':>9} {'kernels':>8} {'analyze s':>9} {'us/rec':>7} {'hb':>6} {'races':>6} "
          f"{'rec_str':>7} {'events':>6} {'hazards':>7} {'peak MiB':>8}")
    for n in (int(x) for x in args.sizes.split(",")):
        tr = synthetic(n)
        kernels = sum(1 for r in tr.records if type(r) is T.Kernel)
        total, hazards = timed(analyze, tr, MY_KINDS)
        split = parts(tr)
        peak = "-" if args.no_memory else f"{peak_memory(analyze, tr, MY_KINDS) / 2**20:.1f}"
        print(f"{n:>9} {kernels:>8} {total:>9.2f} {total / n * 1e6:>7.2f} {split['hb']:>6.2f} "
              f"{split['races']:>6.2f} {split['record_stream']:>7.2f} {split['events']:>6.2f} "
              f"{len(hazards):>7} {peak:>8}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
