//! "No allocation on the pass path of a preconfigured resource": `entry` + `complete` on a
//! resource with flow (rate, concurrency, per-origin), hot-parameter (a known value),
//! authority and breaker rules, plus system rules, counted by a test allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use weir_core::stats::Outcome;
use weir_rules::engine::Context;

mod support;
use support::rules;

/// Counts this thread's allocations (other test threads do not disturb the count).
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// caller's obligations for `GlobalAlloc` carry over to `System` as they are; the only extra
// work is bumping a const-initialised thread-local `Cell`, which neither allocates nor unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; `ptr` came from `System` through `alloc`/`realloc`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn the_pass_path_of_a_preconfigured_resource_does_not_allocate() {
    let (r, clock) = rules(
        "resources:\n  - name: checkout\n    flow:\n      - {id: qps, qps: 1000000, window: 1s, algorithm: gcra}\n      - {id: inflight, concurrency: 100}\n      - {id: web-qps, qps: 1000000, origin: web}\n    hot_params:\n      - {id: per-user, param: 0, threshold: 1000000, window: 1s}\n    authority: {id: callers, allow: [web]}\n    breaker: {id: payment, error_ratio: 0.5, min_calls: 20, open_for: 30s}\nsystem:\n  max_qps: 1000000\n  max_in_flight: 1000\n",
    );
    let params = ["user-1"];
    let ctx = Context {
        origin: "web",
        criticality: weir_core::Criticality::Critical,
        params: &params,
        inbound: true,
        cost: None,
    };
    let call = || {
        r.entry("checkout", &ctx)
            .expect("passes")
            .complete(Outcome::Success);
    };
    // The first calls may create per-value state (the hot value's counter).
    for _ in 0..10 {
        call();
    }
    let before = allocations();
    for _ in 0..1_000 {
        call();
        clock.advance(std::time::Duration::from_micros(10));
    }
    assert_eq!(allocations() - before, 0, "allocations on 1 000 passes");
    // The counter works: an allocation inside the loop is seen.
    let before = allocations();
    drop(std::hint::black_box(vec![1u8; 16]));
    assert_eq!(allocations() - before, 1);
}
