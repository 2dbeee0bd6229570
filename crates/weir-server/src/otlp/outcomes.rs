//! What an exporter did with what it had to send, counted — taken by the collector, failed,
//! or dropped before sending — and those counts as a family of the registry it exports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::admin::metrics::{counters, Collector, Encoder};

/// The counts, relaxed atomics.
#[derive(Debug, Default)]
pub(crate) struct Outcomes {
    /// Taken by the collector.
    pub(crate) sent: AtomicU64,
    /// Not taken, or no answer in time.
    pub(crate) failed: AtomicU64,
    /// Never sent (no room).
    pub(crate) dropped: AtomicU64,
}

/// [`Outcomes`] as the counter family `name` by `result`, its three values named `labels`
/// (sent, failed, dropped).
#[derive(Debug)]
pub(crate) struct OutcomesCollector {
    pub(crate) outcomes: Arc<Outcomes>,
    pub(crate) name: &'static str,
    pub(crate) help: &'static str,
    pub(crate) labels: [&'static str; 3],
}

impl Collector for OutcomesCollector {
    fn encode(&self, mut enc: Encoder) -> std::fmt::Result {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let o = &self.outcomes;
        let [sent, failed, dropped] = self.labels;
        counters(
            &mut enc,
            self.name,
            self.help,
            [
                (sent, load(&o.sent)),
                (failed, load(&o.failed)),
                (dropped, load(&o.dropped)),
            ]
            .map(|(result, v)| ([("result", result)], v)),
        )
    }
}
