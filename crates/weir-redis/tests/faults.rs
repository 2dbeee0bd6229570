//! Faults against real Redis: killed and restarted under load, SCRIPT FLUSH, a server that
//! accepts connections but never answers (SIGSTOP), fail-open / fail-closed, and leases.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_core::rate::{RateAlgorithm, RateSpec};
use weir_redis::{Fallback, RedisConfig, RedisLimiter, RedisRule, RuleOptions};

/// Scheduling slack on this shared 2-core machine, on top of the configured timeout.
const SLACK: Duration = Duration::from_millis(100);

/// The timing-sensitive tests run one at a time (the harness runs tests in parallel).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn gcra(name: &str, instances: u64) -> RedisRule {
    RedisRule::new(
        name,
        &RateSpec::new(RateAlgorithm::Gcra, 1_000, Duration::from_secs(1)).with_burst(100),
        RuleOptions {
            instances,
            ..RuleOptions::default()
        },
    )
    .unwrap()
}

/// Polls `f` every 10 ms for at most `limit`; answers how long it took.
async fn within(limit: Duration, f: impl Fn() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// 8 tasks calling `check` until `stop`; answers (calls, slowest call).
fn load(
    limiter: &RedisLimiter,
    rule: &Arc<RedisRule>,
    run: Duration,
) -> Vec<tokio::task::JoinHandle<(u64, Duration)>> {
    (0..8)
        .map(|t| {
            let (limiter, rule) = (limiter.clone(), rule.clone());
            tokio::spawn(async move {
                let deadline = Instant::now() + run;
                let (mut calls, mut slowest) = (0u64, Duration::ZERO);
                while Instant::now() < deadline && calls < 200_000 {
                    let start = Instant::now();
                    let d = limiter.check(&rule, &format!("user{}", t % 2), 1).await;
                    slowest = slowest.max(start.elapsed());
                    assert!(d.limit() > 0);
                    calls += 1;
                    tokio::task::yield_now().await;
                }
                (calls, slowest)
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_under_load_falls_back_at_once_and_returns_after_restart() {
    let _serial = SERIAL.lock().await;
    let mut redis = support::Redis::start();
    let config = RedisConfig::default();
    let limiter = RedisLimiter::connect(&redis.url(), config).await.unwrap();
    let rule = Arc::new(gcra("kill", 4));
    let tasks = load(&limiter, &rule, Duration::from_millis(2_500));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // On a loaded machine one call can exceed the 30 ms timeout while Redis is healthy (a CI
    // run saw it): that is a real, short switch, counted below; wait for the way back.
    let on_redis = within(Duration::from_secs(2), || limiter.status().on_redis).await;
    assert!(
        on_redis.is_some(),
        "not on Redis under load before the kill"
    );
    tokio::task::block_in_place(|| redis.kill());
    let down = within(Duration::from_secs(1), || !limiter.status().on_redis).await;
    assert!(down.is_some(), "never switched to the fallback");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = limiter.status();
    assert!(during.fallback_decisions > 0);
    tokio::task::block_in_place(|| redis.restart());
    let back = within(Duration::from_secs(3), || limiter.status().on_redis)
        .await
        .expect("back on Redis");
    eprintln!("back on redis {back:?} after the restart");
    assert!(
        back <= Duration::from_secs(1),
        "back on Redis after {back:?}"
    );
    let (mut calls, mut slowest) = (0, Duration::ZERO);
    for t in tasks {
        let (c, s) = t.await.expect("no panic");
        calls += c;
        slowest = slowest.max(s);
    }
    let s = limiter.status();
    eprintln!("{calls} calls, slowest {slowest:?}, {s:?}");
    assert!(slowest <= config.timeout + SLACK, "a call took {slowest:?}");
    // One switch per outage, not one per request (hundreds of thousands of calls here). On a
    // loaded machine a call right after the restart can exceed the 30 ms timeout, which is a
    // real second switch (a CI run saw 2): allow a few, and every one must come back.
    assert!(
        (1..=3).contains(&s.to_fallback),
        "{} switches to the fallback for one outage",
        s.to_fallback
    );
    assert_eq!(s.to_redis, s.to_fallback, "every switch came back to Redis");
    // Errors: the calls already in flight when Redis died, not one per request.
    assert!(s.errors <= 16, "{} errors", s.errors);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_reloads_transparently() {
    let redis = support::Redis::start();
    let limiter = RedisLimiter::connect(&redis.url(), RedisConfig::default())
        .await
        .unwrap();
    // 100 per hour: no refill between the calls.
    let rule = RedisRule::new(
        "flush",
        &RateSpec::new(RateAlgorithm::Gcra, 100, Duration::from_secs(3_600)).with_burst(100),
        RuleOptions::default(),
    )
    .unwrap();
    assert!(limiter.check(&rule, "k", 1).await.allowed());
    let reply = support::raw(redis.port, "SCRIPT FLUSH").unwrap();
    assert!(reply.starts_with("+OK"), "{reply}");
    let d = limiter
        .try_check(&rule, "k", 1, None)
        .await
        .expect("reloaded on NOSCRIPT");
    assert!(d.allowed());
    assert_eq!(d.remaining(), 98, "state kept: 2 of the burst of 100 used");
    let s = limiter.status();
    assert!(
        s.on_redis && s.errors == 0 && s.fallback_decisions == 0,
        "{s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_takes_the_timeout_path() {
    let _serial = SERIAL.lock().await;
    let redis = support::Redis::start();
    let config = RedisConfig::default();
    let limiter = RedisLimiter::connect(&redis.url(), config).await.unwrap();
    let rule = Arc::new(gcra("stop", 2));
    assert!(limiter.check(&rule, "k", 1).await.allowed());
    redis.pause(true);
    let tasks = load(&limiter, &rule, Duration::from_millis(800));
    let mut slowest = Duration::ZERO;
    for t in tasks {
        slowest = slowest.max(t.await.expect("no panic").1);
    }
    let s = limiter.status();
    eprintln!("stopped: slowest {slowest:?}, {s:?}");
    assert!(!s.on_redis && s.to_fallback == 1 && s.fallback_decisions > 0);
    assert!(slowest <= config.timeout + SLACK, "a call took {slowest:?}");
    redis.pause(false);
    let back = within(Duration::from_secs(3), || limiter.status().on_redis).await;
    assert!(
        back.is_some_and(|b| b <= Duration::from_secs(1)),
        "{back:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallbacks_local_share_open_and_closed() {
    let redis = support::Redis::start();
    // Unreachable from the start: a port nobody listens on.
    let dead = format!("redis://127.0.0.1:{}", support::free_port());
    for (fallback, expect_allowed) in [
        (Fallback::Local, 25u64),
        (Fallback::FailOpen, 100),
        (Fallback::FailClosed, 0),
    ] {
        let config = RedisConfig {
            fallback,
            ..RedisConfig::default()
        };
        let limiter = RedisLimiter::connect(&dead, config).await.unwrap();
        // 100 per minute shared by 4 instances: the local share is 25.
        let rule = RedisRule::new(
            format!("fb-{}", fallback.name()),
            &RateSpec::new(RateAlgorithm::FixedWindow, 100, Duration::from_secs(60)),
            RuleOptions {
                instances: 4,
                ..RuleOptions::default()
            },
        )
        .unwrap();
        let mut allowed = 0;
        for _ in 0..100 {
            allowed += u64::from(limiter.check(&rule, "k", 1).await.allowed());
        }
        assert_eq!(allowed, expect_allowed, "{}", fallback.name());
        assert!(!limiter.status().on_redis);
    }
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_leases_hold_release_and_expire() {
    let redis = support::Redis::start();
    let limiter = RedisLimiter::connect(&redis.url(), RedisConfig::default())
        .await
        .unwrap();
    let other = RedisLimiter::connect(&redis.url(), RedisConfig::default())
        .await
        .unwrap();
    let rule = RedisRule::concurrency(
        "leases",
        3,
        Duration::from_millis(400), // lease TTL
        RuleOptions::default(),
    )
    .unwrap();
    let a = limiter.acquire_lease(&rule, "db", 2).await.unwrap();
    let b = other.acquire_lease(&rule, "db", 1).await.unwrap();
    let denied = other.acquire_lease(&rule, "db", 1).await.unwrap_err();
    assert_eq!(denied.remaining(), 0);
    assert!(denied.retry_after().unwrap() <= Duration::from_millis(400));
    limiter.release(a).await;
    let c = other
        .acquire_lease(&rule, "db", 2)
        .await
        .expect("released slots are free");
    // b and c are never released (a crashed holder): they expire with their TTL.
    std::mem::forget((b, c));
    assert!(limiter.acquire_lease(&rule, "db", 1).await.is_err());
    tokio::time::sleep(Duration::from_millis(450)).await;
    let d = limiter
        .acquire_lease(&rule, "db", 3)
        .await
        .expect("expired leases returned");
    limiter.release(d).await;
}
