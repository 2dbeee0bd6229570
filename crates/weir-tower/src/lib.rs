//! Weir as tower middleware for axum, hyper and tonic services.
//!
//! - [`criticality`]: read and write the request criticality in HTTP headers and gRPC metadata
//!   (`x-weir-criticality`), so it propagates from call to call.
//! - [`shed`]: overload shedding with BBR ([`shed::BbrLayer`]): a dropped request gets 503 with
//!   an `application/problem+json` body, lower criticality first.
//! - [`limit`]: rate limiting with any weir-core algorithm, keyed by a [`key::KeyExtractor`]
//!   (client IP behind trusted proxies, header, method + path, closure): 429 with `Retry-After`
//!   (rounded up), `RateLimit-Policy` / `RateLimit` and a problem body.
//! - [`rules`]: a weir-rules rule set ([`rules::RulesLayer`]): requests mapped to resources
//!   by the rule file's routes or a closure; 429 / 403 / 503 by rule kind; paced calls wait;
//!   the guard lives until the response body ends.
//! - [`client`]: client-side layers: circuit breaker, SRE adaptive throttling, retries with
//!   backoff and budget.
//! - [`cost`]: costs stated over HTTP for rules with `cost:` (request header or JSON body
//!   field; response header, trailer, JSON field or the last Server-Sent Event), read as the
//!   body passes and bounded.
//! - [`prefix`]: a request body's first bytes read within a byte budget (the JSON estimate,
//!   `weir proxy`'s read-ahead), handed on whole.
//! - [`concurrency`]: at most N in flight, permits released when the response body ends or is
//!   dropped; 503 when full.
//! - [`gutter`]: a small second upstream taking what a failing primary sheds.
//! - [`trace`]: the W3C `traceparent` and the record a rules layer notes its decision in, for
//!   a tracer to turn into a span that is a child of the caller's.
//! - [`dashboard`]: the live dashboard (a page and its JSON API) over rules, stores and leases.
//! - [`body`]: response bodies holding what a request was admitted with until they end, and
//!   the bodies of refusals; [`problem`]: RFC 9457 problem details and rate-limit headers
//!   (the one header writer); [`key`]: what a limit keys on.
//!
//! A rule file on an axum router (examples/axum_rules.rs is the runnable version, with a
//! watcher that reloads the file):
//!
//! ```
//! use std::path::Path;
//! use std::sync::Arc;
//! use weir_rules::{config::RuleSet, engine::Rules};
//! use weir_tower::rules::RulesLayer;
//!
//! let yaml = "resources:
//!   - name: hello
//!     flow:
//!       - {id: hello-qps, qps: 5}
//! http:
//!   routes:
//!     - {resource: hello, prefix: /hello, params: [{header: x-user}]}
//! ";
//! let set = RuleSet::from_yaml(Path::new("rules.yaml"), yaml).unwrap();
//! let rules = Arc::new(Rules::new(&set).unwrap());
//! let app: axum::Router = axum::Router::new()
//!     .route("/hello", axum::routing::get(|| async { "hello" }))
//!     .layer(RulesLayer::new(rules.clone())); // 429 past 5/s, with Retry-After
//! ```

pub mod body;
pub mod client;
pub mod concurrency;
pub mod cost;
pub mod criticality;
#[cfg(feature = "dashboard")]
pub mod dashboard;
pub mod gutter;
pub mod key;
pub mod limit;
/// Path normal form (shared with the rule files' route prefixes).
pub use weir_rules::path;
pub mod prefix;
pub mod problem;
pub mod rules;
pub mod shed;
pub mod trace;

pub use rules::RulesLayer;
