"""Python `limits` (async, redis) closed-loop load: prints {"ops_per_s", "p50_us", "p99_us"}.

usage: redis_limits.py PORT STRATEGY CONCURRENCY SECONDS   (STRATEGY: fixed, sliding_counter, moving)
"""
import asyncio
import json
import sys
import time

from limits import parse
from limits.aio.storage import RedisStorage
from limits.aio.strategies import (
    FixedWindowRateLimiter,
    MovingWindowRateLimiter,
    SlidingWindowCounterRateLimiter,
)


async def main():
    port, strategy, conc, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    storage = RedisStorage(f"async+redis://127.0.0.1:{port}")
    cls = {"fixed": FixedWindowRateLimiter, "sliding_counter": SlidingWindowCounterRateLimiter,
           "moving": MovingWindowRateLimiter}[strategy]
    limiter = cls(storage)
    item = parse("1000000/second")
    deadline = time.perf_counter() + secs
    lat = []

    async def worker(t):
        i = t
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            assert await limiter.hit(item, "bench", f"k{i % 1000}")
            lat.append(time.perf_counter() - start)
            i += conc

    started = time.perf_counter()
    await asyncio.gather(*(worker(t) for t in range(conc)))
    elapsed = time.perf_counter() - started
    lat.sort()
    pct = lambda p: int(lat[min(int(len(lat) * p), len(lat) - 1)] * 1e6)
    print(json.dumps({"ops_per_s": round(len(lat) / elapsed), "p50_us": pct(0.5), "p99_us": pct(0.99)}))


asyncio.run(main())
