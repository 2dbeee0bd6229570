//! Field grammars shared by the rule kinds: durations (Weir's one grammar, positive), rate
//! algorithms by name, header names and the JSON paths cost rules read.

use std::time::Duration;

use serde::Deserialize;

pub(super) fn window<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = Option::<String>::deserialize(d)?;
    s.map(|s| {
        parse_duration(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{s:?}: expected a positive duration like 500ms, 1s, 5m, 1h or 1d"
            ))
        })
    })
    .transpose()
}

/// A positive duration in Weir's one grammar ([`weir_core::duration`]: `500ms`, `1.5s`, `5m`,
/// `1h`, `1d`), as configuration files take it.
pub fn parse_duration(s: &str) -> Option<Duration> {
    weir_core::duration::parse(s).ok().filter(|d| !d.is_zero())
}

/// RFC 9110 token characters (header names).
pub fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The algorithms a rule file's `algorithm` names (pacing and warm-up come from `behavior`);
/// the default is the first, `sliding_window`.
pub const FILE_ALGORITHMS: [RateAlgorithm; 6] = [
    RateAlgorithm::SlidingWindow,
    RateAlgorithm::FixedWindow,
    RateAlgorithm::SlidingLog,
    RateAlgorithm::SlidingCounter,
    RateAlgorithm::Gcra,
    RateAlgorithm::TokenBucket,
];

/// Reads an `algorithm` field: one of [`FILE_ALGORITHMS`] by its name.
pub(super) fn algorithm<'de, D: serde::Deserializer<'de>>(d: D) -> Result<RateAlgorithm, D::Error> {
    const NAMES: [&str; 6] = [
        "sliding_window",
        "fixed_window",
        "sliding_log",
        "sliding_counter",
        "gcra",
        "token_bucket",
    ];
    let s = String::deserialize(d)?;
    RateAlgorithm::parse_among(&s, &FILE_ALGORITHMS)
        .ok_or_else(|| serde::de::Error::unknown_variant(&s, &NAMES))
}

pub(super) fn optional_algorithm<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<RateAlgorithm>, D::Error> {
    algorithm(d).map(Some)
}

pub(super) fn default_algorithm() -> RateAlgorithm {
    FILE_ALGORITHMS[0]
}

pub use weir_core::rate::RateAlgorithm;

/// A dotted path of JSON object keys (`usage.total_tokens`): no empty segment, at most 8.
pub(super) fn is_json_path(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.split('.').count() <= 8
        && s.split('.').all(|k| !k.is_empty())
}
