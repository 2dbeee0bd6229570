//! Envoy Gateway's drop-in, end to end: the `weir` binary started as `ratelimit` with the
//! environment Envoy Gateway gives envoyproxy/ratelimit (`CONFIG_TYPE=GRPC_XDS_SOTW`, the xDS
//! server's address and node id, `USE_STATSD=false`, Prometheus on a port of its own) takes
//! its configuration from the ADS server of `weir-server/tests/ads`, pushed as Envoy Gateway
//! generates it for a `BackendTrafficPolicy` with two global rules (per client IP, per
//! `x-user-id` value); a real Envoy enforces it. A pushed update applies within 1 s with the
//! counters kept, a bad one is NACKed while the old one serves, and the xDS server killed and
//! restarted costs no decision. Over mutual TLS both ways, as Envoy Gateway runs it: the xDS
//! stream with weir's client certificate, and Envoy's calls to weir with Envoy's.

use crate::ads::{next, serve_tls, Ads, Certs, Snapshot, TYPE_URL};
use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use prost::Message;
use weir_server::xds::proto::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy};

/// Envoy Gateway's names: the listener is the domain, the route the first descriptor.
const DOMAIN: &str = "default/eg/http";
const ROUTE: &str = "httproute/default/backend/rule/0/match/0";

/// What Envoy Gateway generates for the policy: per client IP (`clientSelectors` with
/// `sourceCIDR: {type: Distinct, value: 0.0.0.0/0}`) `per_ip` a minute, per `x-user-id`
/// value (`headers: [{name: x-user-id, type: Distinct}]`) `per_user` a minute.
fn generated(per_ip: u32, per_user: u32, unit: i32) -> Vec<u8> {
    let limit = |n| {
        Some(RateLimitPolicy {
            unit,
            requests_per_unit: n,
            ..RateLimitPolicy::default()
        })
    };
    let leaf = |key: &str, value: &str, rate_limit, descriptors| RateLimitDescriptor {
        key: key.into(),
        value: value.into(),
        rate_limit,
        descriptors,
        ..RateLimitDescriptor::default()
    };
    RateLimitConfig {
        name: DOMAIN.into(),
        domain: DOMAIN.into(),
        descriptors: vec![leaf(
            ROUTE,
            ROUTE,
            None,
            vec![
                leaf(
                    "masked_remote_address",
                    "0.0.0.0/0",
                    None,
                    vec![leaf("remote_address", "", limit(per_ip), vec![])],
                ),
                leaf("rule-1-match-0", "", limit(per_user), vec![]),
            ],
        )],
    }
    .encode_to_vec()
}

/// The Envoy of `deploy/envoy/ratelimit.yaml` with the route's rate limits as Envoy Gateway
/// writes them for the two rules, calling weir over mutual TLS.
fn envoy_config(port: u16, admin: u16, upstream: u16, grpc: u16, certs: &Certs) -> String {
    let doc =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/envoy/ratelimit.yaml");
    let mut yaml = std::fs::read_to_string(doc).unwrap();
    let start = yaml.find("                  rate_limits:\n").unwrap();
    let end = yaml.find("          http_filters:").unwrap();
    let limits = format!(
        "                  rate_limits:
                  - actions:
                    - generic_key: {{descriptor_key: \"{ROUTE}\", descriptor_value: \"{ROUTE}\"}}
                    - masked_remote_address: {{v4_prefix_mask_len: 0}}
                    - remote_address: {{}}
                  - actions:
                    - generic_key: {{descriptor_key: \"{ROUTE}\", descriptor_value: \"{ROUTE}\"}}
                    - request_headers: {{header_name: x-user-id, descriptor_key: rule-1-match-0}}
"
    );
    yaml.replace_range(start..end, &limits);
    let tls = format!(
        "    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context:
          alpn_protocols: [h2]
          tls_certificates:
          - certificate_chain: {{filename: {}}}
            private_key: {{filename: {}}}
          validation_context:
            trusted_ca: {{filename: {}}}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {{exact: localhost}}
    load_assignment:
      cluster_name: ratelimit
",
        certs.client_cert.display(),
        certs.client_key.display(),
        certs.ca.display()
    );
    for (from, to) in [
        ("port_value: 9901}", format!("port_value: {admin}}}")),
        ("port_value: 10000}", format!("port_value: {port}}}")),
        ("port_value: 8000}", format!("port_value: {upstream}}}")),
        ("port_value: 8081}", format!("port_value: {grpc}}}")),
        ("domain: example", format!("domain: \"{DOMAIN}\"")),
        ("    load_assignment:\n      cluster_name: ratelimit\n", tls),
    ] {
        assert!(yaml.contains(from), "{from} in deploy/envoy/ratelimit.yaml");
        yaml = yaml.replacen(from, &to, 1);
    }
    yaml
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A GET through Envoy as the user `user`: the status.
fn get(port: u16, user: &str) -> u16 {
    let header = format!("x-user-id: {user}\r\n");
    common::request(port, "GET", "/x", &header, "").map_or(0, |(s, _)| s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_ratelimit_deployment_runs_weir() {
    // Minute limits: the test counts within one window.
    common::inside_minute(Duration::from_secs(20));
    const MINUTE: i32 = 2;
    let ads_addr = std::net::SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let (push, snapshot) =
        tokio::sync::watch::channel::<Snapshot>(("1".into(), vec![generated(100, 2, MINUTE)]));
    let (ads, mut seen) = Ads::new(snapshot);
    let dir = common::tempdir("xds-e2e");
    let certs = Certs::new(&dir.join("certs"));
    let killable = serve_tls(ads, ads_addr, certs.server_mtls());

    // The binary as Envoy Gateway's Deployment runs it: /bin/ratelimit.
    let ratelimit = dir.join("ratelimit");
    let _ = std::fs::remove_file(&ratelimit);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_weir"), &ratelimit).unwrap();
    let (http, grpc, metrics) = (
        common::free_port(),
        common::free_port(),
        common::free_port(),
    );
    let path = |p: &std::path::Path| p.display().to_string();
    let mut child = Command::new(&ratelimit)
        .envs([
            ("HOST", "127.0.0.1".to_string()),
            ("PORT", http.to_string()),
            ("GRPC_HOST", "127.0.0.1".into()),
            ("GRPC_PORT", grpc.to_string()),
            ("RUNTIME_ROOT", "/data".into()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
            ("RUNTIME_IGNOREDOTFILES", "true".into()),
            ("RUNTIME_WATCH_ROOT", "false".into()),
            ("LOG_LEVEL", "info".into()),
            ("USE_STATSD", "false".into()),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
            ("CONFIG_GRPC_XDS_SERVER_URL", ads_addr.to_string()),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".into()),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
            ("GRPC_SERVER_USE_TLS", "true".into()),
            ("GRPC_SERVER_TLS_CERT", path(&certs.server_cert)),
            ("GRPC_SERVER_TLS_KEY", path(&certs.server_key)),
            ("GRPC_SERVER_TLS_CA_CERT", path(&certs.ca)),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", path(&certs.client_cert)),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", path(&certs.client_key)),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", path(&certs.ca)),
            ("USE_PROMETHEUS", "true".into()),
            ("PROMETHEUS_ADDR", format!("127.0.0.1:{metrics}")),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _weir = Killed(child);
    assert!(line.contains("xDS from"), "{line}");

    let first = next(&mut seen).await;
    assert_eq!(
        (first.node.as_str(), first.type_url.as_str()),
        ("envoy-ratelimit", TYPE_URL)
    );
    let ack = next(&mut seen).await;
    assert_eq!((ack.version.as_str(), ack.error.as_deref()), ("1", None));

    let upstream = common::http1_upstream(|_, _| "upstream".to_string());
    let (port, admin) = (common::free_port(), common::free_port());
    let file = dir.join("envoy.yaml");
    std::fs::write(&file, envoy_config(port, admin, upstream, grpc, &certs)).unwrap();
    let _envoy = Killed(common::start_envoy(&file, admin, port));

    // Two a minute per user: the third of ann's is refused by weir through Envoy.
    let codes: Vec<u16> = (0..3).map(|_| get(port, "ann")).collect();
    assert_eq!(codes, [200, 200, 429]);

    // Four a minute, pushed: ACKed within 1 s, ann's three kept — one more passes.
    let pushed = Instant::now();
    push.send(("2".into(), vec![generated(100, 4, MINUTE)]))
        .unwrap();
    let ack = next(&mut seen).await;
    assert!(
        pushed.elapsed() < Duration::from_secs(1),
        "{:?}",
        pushed.elapsed()
    );
    assert_eq!((ack.version.as_str(), ack.error.as_deref()), ("2", None));
    assert_eq!([get(port, "ann"), get(port, "ann")], [200, 429]);

    // A bad push (no unit): NACKed, version 2 keeps deciding.
    push.send(("3".into(), vec![generated(100, 1, 0)])).unwrap();
    let nack = next(&mut seen).await;
    assert_eq!(nack.version, "2");
    assert!(
        nack.error.as_deref().is_some_and(|e| e.contains("unit")),
        "{nack:?}"
    );
    assert_eq!([get(port, "ann"), get(port, "bob")], [429, 200]);

    // The xDS server killed: decisions go on; restarted with version 4, the stream resumes.
    drop(killable);
    let away: Vec<u16> = (0..5).map(|_| get(port, "cy")).collect();
    assert_eq!(
        away,
        [200, 200, 200, 200, 429],
        "version 2's limit decides while away"
    );
    let (push4, snapshot4) =
        tokio::sync::watch::channel::<Snapshot>(("4".into(), vec![generated(100, 1000, MINUTE)]));
    let (again, mut seen) = Ads::new(snapshot4);
    let _again = serve_tls(again, ads_addr, certs.server_mtls());
    let first = next(&mut seen).await;
    assert_eq!(
        first.version, "2",
        "the new stream asks with the version in force"
    );
    let ack = next(&mut seen).await;
    assert_eq!((ack.version.as_str(), ack.error.as_deref()), ("4", None));
    assert_eq!(get(port, "ann"), 200, "version 4: a thousand a minute");
    drop(push4);
    drop(push);

    // Prometheus' port, as Envoy Gateway scrapes it.
    let text = common::get_body(metrics, "/metrics").expect("metrics on PROMETHEUS_ADDR");
    for line in [
        r#"weir_xds_updates_total{result="applied"} 3"#,
        r#"weir_xds_updates_total{result="rejected"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
}
