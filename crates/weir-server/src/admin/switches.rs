//! Switches set at run time over the admin listener, persisted next to the rule file.
//!
//! `PUT /api/v1/switches/{id}` sets a switch at run time: on (its resource is degraded:
//! blocked with kind `switch`, answered by the route's fallback or 503) without a body or with
//! `{"on": true}`, off with `{"on": false}` — either wins over the rule file until `DELETE`
//! hands the switch back to the file's `on`. `GET /api/v1/switches` lists them: `file`,
//! `override` (the run-time state or null) and `effective`. The routes exist only with
//! `--admin-token` (and need the bearer token). Each change is applied at once, logged, counted
//! (`weir_switch_changes_total`) and written to `RULES.switches.json` beside the rule file
//! (a temporary file, synced, then renamed over the old one), which the next start reads back.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::Path as UrlPath;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde_json::json;
use weir_rules::engine::Rules;

/// Largest state file read back (a few bytes per switch).
pub const MAX_STATE_BYTES: u64 = 1 << 20;

/// Where the switch states of `rules` are kept: `FILE.switches.json` in its directory.
pub fn state_path(rules: &Path) -> PathBuf {
    crate::state_file::beside(rules, ".switches.json")
}

/// The states saved in `path` (none when it does not exist); an unreadable or malformed file
/// is an error naming it.
pub fn load(path: &Path) -> Result<HashMap<String, bool>, crate::state_file::StateFileError> {
    let saved =
        crate::state_file::load(path, MAX_STATE_BYTES, "{\"SWITCH_ID\": true|false, …}", "")?;
    Ok(saved.unwrap_or_default())
}

/// Writes `states` to `path` atomically: a temporary file beside it, synced, renamed over it.
pub fn save(path: &Path, states: &HashMap<String, bool>) -> std::io::Result<()> {
    let sorted: std::collections::BTreeMap<&String, &bool> = states.iter().collect();
    crate::state_file::save(path, &sorted, true)
}

/// What the switch routes need.
#[derive(Clone)]
pub struct Switches {
    /// The rules whose switches these are.
    pub rules: Arc<Rules<weir_core::AnyClock>>,
    /// The state file.
    pub path: PathBuf,
    /// Changes made through the API (the `weir_switch_changes` metric).
    pub changes: Arc<std::sync::atomic::AtomicU64>,
    /// Serialises changes, so the file always holds the last one.
    pub lock: Arc<tokio::sync::Mutex<()>>,
}

/// `GET /api/v1/switches`, `PUT` and `DELETE /api/v1/switches/{id}`.
pub fn routes(s: Switches) -> Router {
    let (on, off) = (s.clone(), s.clone());
    Router::new()
        .route(
            "/api/v1/switches",
            get(move || {
                let list = s.rules.switches();
                async move { Json(list) }
            }),
        )
        .route(
            "/api/v1/switches/{id}",
            put(
                move |UrlPath(id): UrlPath<String>, body: axum::body::Bytes| async move {
                    match requested_state(&body) {
                        Ok(state) => set(on, id, Some(state)).await,
                        Err(e) => {
                            (StatusCode::BAD_REQUEST, Json(json!({"error": e}))).into_response()
                        }
                    }
                },
            )
            .delete(move |UrlPath(id): UrlPath<String>| set(off, id, None)),
        )
}

/// The state a `PUT` asks for: on without a body, else its `{"on": true|false}`.
fn requested_state(body: &[u8]) -> Result<bool, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        on: bool,
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(true);
    }
    serde_json::from_slice::<Body>(body)
        .map(|b| b.on)
        .map_err(|e| format!("request body: expected {{\"on\": true|false}}: {e}"))
}

/// Sets switch `id` at run time (`Some`), or hands it back to the rule file (`None`).
async fn set(s: Switches, id: String, state: Option<bool>) -> Response {
    let _one_at_a_time = s.lock.lock().await;
    let changed = match state {
        Some(on) => s.rules.set_switch(&id, on),
        None => s.rules.clear_switch(&id),
    };
    if let Err(e) = changed {
        return (StatusCode::NOT_FOUND, Json(json!({"error": e.to_string()}))).into_response();
    }
    let on = state;
    s.changes.fetch_add(1, Ordering::Relaxed);
    let states = s.rules.switch_overrides();
    let path = s.path.clone();
    let saved = tokio::task::spawn_blocking(move || save(&path, &states)).await;
    let state = s.rules.switches().into_iter().find(|x| x.id == id);
    match saved {
        Ok(Ok(())) => {
            tracing::info!(switch = id, on = ?on, file = %s.path.display(), "switch set over the admin API (on = None: back to the rule file)");
            (StatusCode::OK, Json(json!(state))).into_response()
        }
        Ok(Err(e)) => {
            tracing::error!(
                switch = id,
                on = ?on,
                "switch set but not saved to {}: {e}",
                s.path.display()
            );
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"error": format!("applied, but not saved to {}: {e}", s.path.display()), "switch": state})),
            )
                .into_response()
        }
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": e.to_string()})),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_the_file_and_bad_files_are_named() {
        let dir = std::env::temp_dir().join(format!("weir-switches-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = state_path(&dir.join("rules.yaml"));
        assert!(path.ends_with("rules.yaml.switches.json"));
        assert!(load(&path).unwrap().is_empty(), "absent: no states");
        let states = HashMap::from([("a".to_string(), true), ("b".to_string(), false)]);
        save(&path, &states).unwrap();
        assert_eq!(load(&path).unwrap(), states);
        std::fs::write(&path, "{\"a\": \"yes\"}").unwrap();
        let e = load(&path).unwrap_err();
        assert!(
            matches!(
                e,
                crate::state_file::StateFileError::Malformed { line: 1, .. }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("rules.yaml.switches.json:1:"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
