//! The export loop: at each interval the registry is rendered (as a scrape renders it),
//! encoded and sent on a task of its own; at most one export is in flight, a tick that finds
//! one is dropped, and failures are logged at most once a minute.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_core::log_gate::LogGate;

use super::encode::{metrics, Times};
use super::outcomes::{Outcomes, OutcomesCollector};
use super::proto::{
    ExportMetricsServiceRequest, InstrumentationScope, ResourceMetrics, ScopeMetrics,
};
use super::resource::{monotonic_nanos, resource, unix_nanos};
use super::send::Sender;
use super::trace::Tracer;
use super::Settings;
use crate::admin::metrics::Metrics;

/// A running exporter; dropping it stops the exports.
#[derive(Debug)]
pub struct Exporter {
    task: tokio::task::JoinHandle<()>,
    stats: Arc<Outcomes>,
    /// The tracer and its export task, when traces were asked for.
    traces: Option<(Arc<Tracer>, tokio::task::JoinHandle<()>)>,
}

impl Exporter {
    /// The tracer decisions are recorded with, when the settings sample traces
    /// ([`Settings::sampling`]): give it to `Server`'s builder or `Proxy::trace`.
    pub fn tracer(&self) -> Option<&Arc<Tracer>> {
        self.traces.as_ref().map(|(t, _)| t)
    }

    /// Exports taken by the collector so far.
    pub fn exported(&self) -> u64 {
        self.stats.sent.load(Ordering::Relaxed)
    }

    /// Exports that failed or were dropped so far.
    pub fn lost(&self) -> u64 {
        self.stats.failed.load(Ordering::Relaxed) + self.stats.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.task.abort();
        if let Some((_, t)) = &self.traces {
            t.abort();
        }
    }
}

/// Starts exporting every family of `registry` as `settings` say, on the current tokio
/// runtime, and the spans of decisions when the settings sample traces; the exporter's own
/// counts (`weir_otlp_exports_total`, `weir_otlp_spans_total`) join the registry.
pub fn spawn(registry: Arc<Metrics>, settings: Settings) -> Exporter {
    let stats = Arc::new(Outcomes::default());
    registry.register(OutcomesCollector {
        outcomes: stats.clone(),
        name: "weir_otlp_exports",
        help: "OTLP metric exports, by result (ok; failed: not taken, or no answer in time; dropped: the previous export was still unanswered at the interval).",
        labels: ["ok", "failed", "dropped"],
    });
    let traces = super::trace::spawn(&registry, &settings);
    let task = tokio::spawn(run(registry, settings, stats.clone()));
    Exporter {
        task,
        stats,
        traces,
    }
}

/// A minute between log lines about a failing collector.
static FAILURES: LogGate = LogGate::new(60_000_000_000);

async fn run(registry: Arc<Metrics>, settings: Settings, stats: Arc<Outcomes>) {
    let sender = Arc::new(Sender::new(
        settings.protocol,
        settings.target.clone(),
        settings.timeout,
        super::send::GRPC_METRICS,
    ));
    let resource = resource(&settings);
    let start = unix_nanos();
    let in_flight = Arc::new(AtomicBool::new(false));
    let mut tick = tokio::time::interval(settings.interval.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: wait one interval before the first export.
    tick.tick().await;
    loop {
        tick.tick().await;
        if in_flight.swap(true, Ordering::AcqRel) {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let times = Times {
            start,
            now: unix_nanos(),
        };
        let request = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(resource.clone()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope {
                        name: "weir".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                    }),
                    metrics: metrics(&registry.render(), times),
                }],
            }],
        };
        let (sender, stats, in_flight) = (sender.clone(), stats.clone(), in_flight.clone());
        let target = settings.target.clone();
        tokio::spawn(async move {
            match sender.send(&request).await {
                Ok(()) => {
                    stats.sent.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    if let Some(held) = FAILURES.open(monotonic_nanos()) {
                        tracing::warn!(
                            collector = %target,
                            error = %e,
                            failures_not_logged = held,
                            "OTLP export failed (logged at most once a minute; counted in weir_otlp_exports_total)"
                        );
                    }
                }
            }
            in_flight.store(false, Ordering::Release);
        });
    }
}
