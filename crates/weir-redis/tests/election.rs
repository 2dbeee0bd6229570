//! Leader election on a real Redis and a real 3-node Redis Cluster: one leader, fencing,
//! snapshots handed to the next leader, resignation, and an unreachable store.

mod support;

use std::time::Duration;

use weir_redis::leader::{Election, Term};

const TTL: Duration = Duration::from_secs(30);
const T: Duration = Duration::from_secs(2);

fn election(url: &str, group: &str, address: &str) -> Election {
    Election::new(url, group, address, T).unwrap()
}

async fn exercise(url: &str, raw: impl Fn(&str) -> String) {
    let a = election(url, "g1", "http://a:1");
    let b = election(url, "g1", "http://b:2");
    // The first campaign elects a, with nothing stored yet.
    let Term::Leader {
        token: ta,
        elected: true,
        snapshot: None,
    } = a.campaign(None, TTL, None, TTL).await.unwrap()
    else {
        panic!("a not elected");
    };
    // b learns a's address.
    assert_eq!(
        b.campaign(None, TTL, None, TTL).await.unwrap(),
        Term::Follower {
            leader: "http://a:1".into()
        }
    );
    // a renews and stores its snapshot; the key got its time to live.
    assert_eq!(
        a.campaign(Some(ta), TTL, Some(b"snap-1"), TTL)
            .await
            .unwrap(),
        Term::Leader {
            token: ta,
            elected: false,
            snapshot: None
        }
    );
    let pttl: i64 = raw("PTTL weir:{quota:g1}:leader")
        .trim_start_matches(':')
        .trim()
        .parse()
        .unwrap();
    assert!(pttl > 25_000 && pttl <= 30_000, "{pttl}");
    // The key lapses (as if a stopped renewing for its time to live): b is elected with a
    // larger token and a's snapshot.
    raw("DEL weir:{quota:g1}:leader");
    let Term::Leader {
        token: tb,
        elected: true,
        snapshot: Some(s),
    } = b.campaign(None, TTL, None, TTL).await.unwrap()
    else {
        panic!("b not elected");
    };
    assert!(tb > ta);
    assert_eq!(s, b"snap-1");
    // a, deposed, tries to renew with its old token: refused, its snapshot not written.
    assert_eq!(
        a.campaign(Some(ta), TTL, Some(b"stale"), TTL)
            .await
            .unwrap(),
        Term::Follower {
            leader: "http://b:2".into()
        }
    );
    assert!(raw("GET weir:{quota:g1}:snapshot").contains("snap-1"));
    // Another group is independent.
    assert!(matches!(
        election(url, "g2", "http://c:3")
            .campaign(None, TTL, None, TTL)
            .await
            .unwrap(),
        Term::Leader { elected: true, .. }
    ));
    // b resigns with a last snapshot: a is elected at once and gets it.
    assert!(b.resign(Some(b"snap-2"), TTL).await.unwrap());
    assert!(!b.resign(None, TTL).await.unwrap(), "only once");
    let Term::Leader {
        token: ta2,
        elected: true,
        snapshot: Some(s),
    } = a.campaign(Some(ta), TTL, None, TTL).await.unwrap()
    else {
        panic!("a not elected again");
    };
    assert!(ta2 > tb);
    assert_eq!(s, b"snap-2");
}

#[tokio::test]
async fn one_leader_fencing_snapshots_and_resignation_on_redis() {
    let redis = support::Redis::start();
    let port = redis.port;
    exercise(&redis.url(), |cmd| support::raw(port, cmd).unwrap()).await;
}

#[tokio::test]
async fn the_same_on_a_redis_cluster() {
    let cluster = support::Cluster::start();
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    let url = format!(
        "redis+cluster://{}",
        ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    // Raw commands go to whichever node owns the group's slot (the others answer MOVED).
    let raw = |cmd: &str| {
        ports
            .iter()
            .map(|p| support::raw(*p, cmd).unwrap())
            .find(|r| !r.starts_with("-MOVED"))
            .unwrap()
    };
    exercise(&url, raw).await;
}

#[tokio::test]
async fn an_unreachable_store_is_an_error_within_the_timeout() {
    let port = support::free_port();
    let e = Election::new(
        &format!("redis://127.0.0.1:{port}"),
        "g",
        "http://a:1",
        Duration::from_millis(300),
    )
    .unwrap();
    let started = std::time::Instant::now();
    assert!(e.campaign(None, TTL, None, TTL).await.is_err());
    assert!(started.elapsed() < Duration::from_secs(5));
}
