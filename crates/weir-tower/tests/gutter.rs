//! The gutter service on a manual clock: a failing primary's breaker sends traffic to the
//! gutter; the gutter at its limit throws the excess back at the primary, rejected while the
//! primary's breaker is open; the primary's recovery is probed and traffic returns to it.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{Service, ServiceExt};
use weir_core::breaker::{BreakerConfig, BreakerState, Window};
use weir_core::ManualClock;
use weir_tower::gutter::{Gutter, GutterError, GutterStats, LaneConfig};

fn lane(max_in_flight: u64) -> LaneConfig {
    LaneConfig {
        breaker: BreakerConfig {
            window: Window::Count(4),
            min_calls: 4,
            error_ratio: Some(0.5),
            open_duration: Duration::from_secs(10),
            max_probes: 1,
            successes_to_close: 1,
            ..BreakerConfig::resilience4j()
        },
        max_in_flight,
    }
}

/// An upstream answering `status`, counting its calls; `hold` keeps each call pending until
/// released.
#[derive(Clone)]
struct Upstream {
    failing: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
    hold: Option<Arc<tokio::sync::Notify>>,
}

impl Upstream {
    fn new(failing: bool) -> Self {
        Self {
            failing: Arc::new(AtomicBool::new(failing)),
            calls: Arc::new(AtomicUsize::new(0)),
            hold: None,
        }
    }
}

impl Service<Request<()>> for Upstream {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<()>, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let status = if self.failing.load(Ordering::SeqCst) {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::OK
        };
        let hold = self.hold.clone();
        Box::pin(async move {
            if let Some(h) = hold {
                h.notified().await;
            }
            let mut r = Response::new(());
            *r.status_mut() = status;
            Ok(r)
        })
    }
}

async fn send<S>(svc: &mut S) -> Result<StatusCode, String>
where
    S: Service<Request<()>, Response = Response<()>, Error = GutterError<Infallible>>,
{
    match svc.ready().await {
        Ok(s) => s
            .call(Request::new(()))
            .await
            .map(|r| r.status())
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test]
async fn the_gutter_takes_what_the_primary_sheds_and_traffic_returns_after_the_probe() {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let primary = Upstream::new(true);
    let gutter_up = Upstream::new(false);
    let release = Arc::new(tokio::sync::Notify::new());
    let mut svc = Gutter::with_clock(
        primary.clone(),
        gutter_up.clone(),
        &lane(100),
        &lane(2),
        clock.clone(),
    )
    .unwrap();

    // The primary fails its first four calls: clients see them (the breaker's trip
    // threshold), then the breaker opens and the gutter answers.
    for _ in 0..4 {
        assert_eq!(send(&mut svc).await, Ok(StatusCode::INTERNAL_SERVER_ERROR));
    }
    assert_eq!(svc.states().0, BreakerState::Open);
    for _ in 0..5 {
        assert_eq!(send(&mut svc).await, Ok(StatusCode::OK));
    }
    assert_eq!(primary.calls.load(Ordering::SeqCst), 4);
    assert_eq!(gutter_up.calls.load(Ordering::SeqCst), 5);

    // The gutter holds 2 at once: with 2 calls pending there, a third is thrown back at the
    // primary, whose breaker is open: rejected at once.
    let slow_gutter = Upstream {
        hold: Some(release.clone()),
        ..Upstream::new(false)
    };
    let mut busy = Gutter::with_clock(
        primary.clone(),
        slow_gutter.clone(),
        &lane(100),
        &lane(2),
        clock.clone(),
    )
    .unwrap();
    for _ in 0..4 {
        assert!(send(&mut busy).await.is_ok());
    }
    assert_eq!(busy.states().0, BreakerState::Open);
    let pending: Vec<_> = (0..2)
        .map(|_| {
            let mut s = busy.clone();
            tokio::spawn(async move { send(&mut s).await })
        })
        .collect();
    for _ in 0..10_000 {
        if slow_gutter.calls.load(Ordering::SeqCst) == 2 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        slow_gutter.calls.load(Ordering::SeqCst),
        2,
        "both pending in the gutter"
    );
    let refused = send(&mut busy).await.unwrap_err();
    assert!(refused.contains("both refused"), "{refused}");
    assert_eq!(
        busy.stats(),
        GutterStats {
            primary: 4,
            gutter: 2,
            thrown_back: 0,
            rejected: 1
        }
    );
    release.notify_waiters();
    for p in pending {
        assert_eq!(p.await.unwrap(), Ok(StatusCode::OK));
    }

    // The primary recovers: after the open time one probe goes to it, succeeds, and the
    // breaker closes: traffic is back on the primary.
    primary.failing.store(false, Ordering::SeqCst);
    clock.advance(Duration::from_secs(10));
    let mut held = svc.clone();
    assert_eq!(send(&mut held).await, Ok(StatusCode::OK));
    assert_eq!(held.states().0, BreakerState::Closed);
    let before = gutter_up.calls.load(Ordering::SeqCst);
    for _ in 0..3 {
        assert_eq!(send(&mut held).await, Ok(StatusCode::OK));
    }
    assert_eq!(
        gutter_up.calls.load(Ordering::SeqCst),
        before,
        "none to the gutter"
    );
    let s = held.stats();
    assert_eq!((s.primary, s.gutter, s.rejected), (4 + 1 + 3, 5, 0));
}
