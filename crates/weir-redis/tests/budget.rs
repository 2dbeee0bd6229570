//! Calendar budgets on a real Redis: one count per rule, key and period that every instance
//! shares, taken atomically under concurrency, corrected by settlements, kept by Redis when an
//! instance restarts, and on a 3-node Redis Cluster.

mod support;

use std::time::Duration;

use weir_core::budget::CountOf;
use weir_core::calendar::Period;
use weir_redis::{RedisConfig, RedisLimiter};

fn config() -> RedisConfig {
    RedisConfig {
        timeout: Duration::from_secs(5),
        ..RedisConfig::default()
    }
}

/// A month: November 2026 in UTC.
const NOVEMBER: Period = Period {
    start: 1_793_491_200,
    end: 1_796_083_200,
};
const DECEMBER: Period = Period {
    start: 1_796_083_200,
    end: 1_798_761_600,
};
const NOW: i64 = 1_795_000_000;

fn of<'a>(rule: &'a str, key: &'a str, period: Period) -> CountOf<'a> {
    CountOf { rule, key, period }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_share_one_count_taken_atomically() {
    let redis = support::Redis::start();
    let a = RedisLimiter::connect(&redis.url(), config()).await.unwrap();
    let b = RedisLimiter::connect(&redis.url(), config()).await.unwrap();
    // 40 takes of one unit at once, half through each instance, on a hard limit of 25.
    let mut tasks = Vec::new();
    for i in 0..40 {
        let l = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            l.budget_take(&of("month", "ann", NOVEMBER), NOW, 1, 25, true)
                .await
                .unwrap()
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += u64::from(t.await.unwrap().admitted);
    }
    assert_eq!(admitted, 25);
    let refused = b
        .budget_take(&of("month", "ann", NOVEMBER), NOW, 1, 25, true)
        .await
        .unwrap();
    assert_eq!((refused.admitted, refused.used), (false, 25));
    // A settlement gives 10 back for every instance; a correction never goes below 0.
    a.budget_add(&of("month", "ann", NOVEMBER), NOW, -10)
        .await
        .unwrap();
    let t = b
        .budget_take(&of("month", "ann", NOVEMBER), NOW, 10, 25, true)
        .await
        .unwrap();
    assert_eq!((t.admitted, t.used), (true, 25));
    let floor = a
        .budget_add(&of("month", "bob", NOVEMBER), NOW, -50)
        .await
        .unwrap();
    assert_eq!(floor.used, 0);
    // December is a count of its own; a soft budget admits past its limit and counts.
    let dec = a
        .budget_take(&of("month", "ann", DECEMBER), DECEMBER.start, 25, 25, true)
        .await
        .unwrap();
    assert_eq!((dec.admitted, dec.used), (true, 25));
    let soft = a
        .budget_take(&of("soft", "ann", NOVEMBER), NOW, 30, 25, false)
        .await
        .unwrap();
    assert_eq!((soft.admitted, soft.used), (true, 30));
    // The count lives until a day after its period ends.
    let ttl: i64 = support::raw(redis.port, "TTL weir:{budget:5:month:ann}:1793491200")
        .unwrap()
        .trim_start_matches(':')
        .trim()
        .parse()
        .unwrap();
    let want = NOVEMBER.end - NOW + 86_400;
    assert!((want - 5..=want).contains(&ttl), "{ttl} vs {want}");
    // An instance started again sees the count Redis kept.
    drop(a);
    let c = RedisLimiter::connect(&redis.url(), config()).await.unwrap();
    let again = c
        .budget_take(&of("month", "ann", NOVEMBER), NOW, 1, 25, true)
        .await
        .unwrap();
    assert_eq!((again.admitted, again.used), (false, 25));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_count_on_a_redis_cluster() {
    let cluster = support::Cluster::start();
    let a = RedisLimiter::connect(&cluster.url(), config())
        .await
        .unwrap();
    for user in ["ann", "bob", "cat", "dan"] {
        for _ in 0..3 {
            assert!(
                a.budget_take(&of("day", user, NOVEMBER), NOW, 1, 3, true)
                    .await
                    .unwrap()
                    .admitted
            );
        }
        let t = a
            .budget_take(&of("day", user, NOVEMBER), NOW, 1, 3, true)
            .await
            .unwrap();
        assert_eq!((t.admitted, t.used), (false, 3), "{user}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_is_an_error_the_caller_counts_around() {
    let mut redis = support::Redis::start();
    let a = RedisLimiter::connect(
        &redis.url(),
        RedisConfig {
            timeout: Duration::from_millis(200),
            ..RedisConfig::default()
        },
    )
    .await
    .unwrap();
    redis.kill();
    assert!(a
        .budget_take(&of("month", "ann", NOVEMBER), NOW, 1, 25, true)
        .await
        .is_err());
}
