//! Names with at most one `*` — the quota file's resource templates (`tenant-*`) and its
//! client ids (`checkout-*`): one matcher for both.

/// Whether `name` is `pattern` (exact), or, with one `*`, starts with what comes before it and
/// ends with what comes after (the `*` may match nothing).
pub fn matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((pre, post)) => {
            name.len() >= pre.len() + post.len() && name.starts_with(pre) && name.ends_with(post)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn one_star_matches_any_middle() {
        assert!(matches("a", "a") && !matches("a", "ab"));
        assert!(matches("t-*", "t-") && matches("t-*", "t-x") && !matches("t-*", "u-x"));
        assert!(matches("*-eu", "a-eu") && matches("a*z", "az") && !matches("ab*ba", "aba"));
    }
}
