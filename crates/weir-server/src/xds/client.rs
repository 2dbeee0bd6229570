//! The aggregated stream: one `DiscoveryRequest` asking for every `RateLimitConfig`, then for
//! each response the configuration put in force and ACKed (or NACKed with its errors), until
//! the stream ends — then again after a backoff.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use envoy_types::pb::google::rpc::Status;
use prost::Message;
use tokio::sync::mpsc;

use super::proto::{RateLimitConfig, TYPE_URL};
use super::{Settings, Stats, StatsCollector};
use crate::rls::Service;

/// `google.rpc.Code.INVALID_ARGUMENT`: the code of a NACK.
const INVALID_ARGUMENT: i32 = 3;

/// A running xDS client; dropping it closes the stream and stops asking.
#[derive(Debug)]
pub struct XdsClient {
    task: tokio::task::JoinHandle<()>,
    stats: Arc<Stats>,
}

impl XdsClient {
    /// Starts asking `settings.server` for the configuration of `service`, on the current
    /// tokio runtime; its counts join the service's metrics.
    pub fn spawn(service: Arc<Service>, settings: Settings) -> Self {
        let stats = Arc::new(Stats::default());
        service.metrics().register(StatsCollector(stats.clone()));
        let task = tokio::spawn(run(service, settings, stats.clone()));
        Self { task, stats }
    }

    /// Configurations applied so far.
    pub fn applied(&self) -> u64 {
        self.stats.applied.load(Ordering::Relaxed)
    }

    /// Configurations refused (NACKed) so far.
    pub fn rejected(&self) -> u64 {
        self.stats.rejected.load(Ordering::Relaxed)
    }

    /// Whether a stream is open.
    pub fn connected(&self) -> bool {
        self.stats.connected.load(Ordering::Relaxed)
    }
}

impl Drop for XdsClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a stream left for the next: the version last accepted.
#[derive(Default)]
struct Accepted {
    version: String,
}

async fn run(service: Arc<Service>, settings: Settings, stats: Arc<Stats>) {
    let mut accepted = Accepted::default();
    let mut wait = settings.backoff_initial;
    // Renewed TLS files end the stream: the next one connects with them.
    let renewed = Arc::new(tokio::sync::watch::Sender::new(0u64));
    let _watchers = watch_tls(&settings, &renewed);
    loop {
        let opened = stream(&service, &settings, &stats, &mut accepted, &renewed).await;
        stats.connected.store(false, Ordering::Relaxed);
        match opened {
            // It was open and ended: start again from the first wait.
            Ok(()) => wait = settings.backoff_initial,
            Err(e) => tracing::warn!(
                server = %settings.server,
                error = %e,
                retry_in = ?wait,
                "xDS stream failed; the configuration in force keeps serving"
            ),
        }
        tokio::time::sleep(jittered(wait, settings.backoff_jitter)).await;
        wait = (wait * 2).min(settings.backoff_max);
    }
}

/// One stream, until it ends (`Ok`) or fails before or while open (`Err`).
async fn stream(
    service: &Arc<Service>,
    s: &Settings,
    stats: &Stats,
    accepted: &mut Accepted,
    renewed: &tokio::sync::watch::Sender<u64>,
) -> Result<(), String> {
    // Renewals from now on (the files are read below).
    let mut renewals = renewed.subscribe();
    let mut endpoint = tonic::transport::Endpoint::from(uri(s))
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    if let Some(tls) = &s.tls {
        endpoint = endpoint
            .tls_config(tls_config(s, tls)?)
            .map_err(|e| error_chain(&e))?;
    }
    let channel = endpoint.connect().await.map_err(|e| error_chain(&e))?;
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(s.max_message);
    let (tx, rx) = mpsc::channel::<DiscoveryRequest>(4);
    let first = DiscoveryRequest {
        version_info: accepted.version.clone(),
        node: Some(node(s)),
        type_url: TYPE_URL.into(),
        ..DiscoveryRequest::default()
    };
    tx.send(first).await.map_err(|e| e.to_string())?;
    let requests =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut request = tonic::Request::new(requests);
    for (k, v) in &s.headers {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(k.as_bytes()),
            tonic::metadata::MetadataValue::try_from(v.as_str()),
        ) {
            request.metadata_mut().insert(k, v);
        }
    }
    let mut responses = client
        .stream_aggregated_resources(request)
        .await
        .map_err(|e| format!("{}: {}", e.code(), e.message()))?
        .into_inner();
    stats.streams.fetch_add(1, Ordering::Relaxed);
    stats.connected.store(true, Ordering::Relaxed);
    tracing::info!(server = %s.server, node = %s.node_id, "xDS stream open");
    loop {
        let message = tokio::select! {
            m = responses.message() => m,
            _ = renewals.changed() => {
                tracing::info!(server = %s.server, "xDS TLS files renewed: reconnecting with them");
                return Ok(());
            }
        };
        let response = match message {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
            Err(e) => {
                // Open, then broken: the next stream starts from the first wait.
                tracing::warn!(server = %s.server, error = %e.message(), "xDS stream ended");
                return Ok(());
            }
        };
        // Compiled off the runtime's workers, as a file's reload is: a push of tens of
        // thousands of rules never stalls the decisions in flight.
        let (version, nonce) = (response.version_info.clone(), response.nonce.clone());
        let (svc, merge) = (service.clone(), s.merge_domains);
        let taken = tokio::task::spawn_blocking(move || take(&svc, merge, &response))
            .await
            .unwrap_or_else(|e| Err(format!("the configuration's compilation failed: {e}")));
        let answer = match taken {
            Ok(()) => {
                stats.applied.fetch_add(1, Ordering::Relaxed);
                accepted.version = version.clone();
                tracing::info!(version = %version, "xDS configuration applied");
                None
            }
            Err(message) => {
                stats.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    version = %version,
                    error = %message,
                    "xDS configuration rejected; the previous one keeps serving"
                );
                Some(Status {
                    code: INVALID_ARGUMENT,
                    message,
                    details: Vec::new(),
                })
            }
        };
        let ack = DiscoveryRequest {
            version_info: accepted.version.clone(),
            node: Some(node(s)),
            type_url: TYPE_URL.into(),
            response_nonce: nonce,
            error_detail: answer,
            ..DiscoveryRequest::default()
        };
        if tx.send(ack).await.is_err() {
            return Ok(());
        }
    }
}

/// Puts the response's configuration in force; what is wrong with it, one problem a line.
fn take(
    service: &Service,
    merge_domains: bool,
    response: &DiscoveryResponse,
) -> Result<(), String> {
    if response.type_url != TYPE_URL {
        return Err(format!(
            "type_url {:?}: expected {TYPE_URL}",
            response.type_url
        ));
    }
    let mut configs = Vec::with_capacity(response.resources.len());
    for (i, any) in response.resources.iter().enumerate() {
        if any.type_url != TYPE_URL {
            return Err(format!(
                "resources[{i}]: type_url {:?}: expected {TYPE_URL}",
                any.type_url
            ));
        }
        let c = RateLimitConfig::decode(any.value.as_slice())
            .map_err(|e| format!("resources[{i}]: not a RateLimitConfig: {e}"))?;
        configs.push(c);
    }
    let domains = super::convert::domains(&configs, merge_domains).map_err(|errors| {
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    service.apply(&domains).map_err(|e| e.to_string())
}

/// How often the TLS files are checked for a renewal.
const TLS_CHECK: Duration = Duration::from_secs(1);

/// Watchers of the client's TLS files, each counting a renewal in `renewed` when its file's
/// contents change (kept for as long as the client runs).
fn watch_tls(
    s: &Settings,
    renewed: &Arc<tokio::sync::watch::Sender<u64>>,
) -> Vec<weir_rules::watch::Watcher> {
    let Some(tls) = &s.tls else {
        return Vec::new();
    };
    let mut files = vec![tls.ca.clone()];
    if let Some((c, k)) = &tls.identity {
        files.extend([c.clone(), k.clone()]);
    }
    files
        .into_iter()
        .filter_map(|f| {
            let renewed = renewed.clone();
            weir_rules::watch::Watcher::on_change(f, TLS_CHECK, move || {
                renewed.send_modify(|n| *n += 1);
                true
            })
            .ok()
        })
        .collect()
}

/// The server's URI, `https` when TLS is on.
fn uri(s: &Settings) -> http::Uri {
    if s.tls.is_none() || s.server.scheme_str() == Some("https") {
        return s.server.clone();
    }
    let authority = s.server.authority().map_or("", |a| a.as_str());
    format!("https://{authority}")
        .parse()
        .unwrap_or_else(|_| s.server.clone())
}

/// The client's TLS, its files read now.
fn tls_config(
    s: &Settings,
    tls: &super::ClientTls,
) -> Result<tonic::transport::ClientTlsConfig, String> {
    let read = |f: &std::path::Path| std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()));
    let mut config = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(read(&tls.ca)?));
    if let Some((cert, key)) = &tls.identity {
        config = config.identity(tonic::transport::Identity::from_pem(
            read(cert)?,
            read(key)?,
        ));
    }
    let name = tls
        .server_name
        .clone()
        .or_else(|| s.server.host().map(str::to_string));
    if let Some(n) = name {
        config = config.domain_name(n);
    }
    Ok(config)
}

fn node(s: &Settings) -> Node {
    let metadata = (!s.node_metadata.is_empty()).then(|| Struct {
        fields: s
            .node_metadata
            .iter()
            .map(|(k, v)| {
                let v = Value {
                    kind: Some(Kind::StringValue(v.clone())),
                };
                (k.clone(), v)
            })
            .collect(),
    });
    Node {
        id: s.node_id.clone(),
        metadata,
        user_agent_name: "weir".into(),
        ..Node::default()
    }
}

/// `d` within ± `share` of itself.
fn jittered(d: Duration, share: f64) -> Duration {
    let share = share.clamp(0.0, 1.0);
    d.mul_f64(1.0 + share * (2.0 * fastrand::f64() - 1.0))
}

/// An error with its causes (tonic's own message is only "transport error").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_jittered_within_their_share() {
        for _ in 0..1_000 {
            let d = jittered(Duration::from_secs(10), 0.5);
            assert!(
                d >= Duration::from_secs(5) && d <= Duration::from_secs(15),
                "{d:?}"
            );
        }
        assert_eq!(
            jittered(Duration::from_secs(3), 0.0),
            Duration::from_secs(3)
        );
    }
}
