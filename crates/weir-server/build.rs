//! Compiles the gRPC services `weir serve` speaks — Envoy's rate limit service (RLS) and rate
//! limit quota service (RLQS), from the `.proto` files the envoy-types crate ships, and Weir's
//! quota lease API from `proto/` — into one encoded descriptor set for gRPC server reflection,
//! so that grpcurl and other tools call `weir serve` with no `.proto` files at hand.

use std::path::{Path, PathBuf};
use std::process::Command;

use prost::Message;

const ROOTS: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
    "weir/quota/v1/quota.proto",
];

fn main() {
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let ours = here.join("../../proto");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", ours.display());
    let envoy = match envoy_types_protos(&here) {
        Ok(dir) => dir,
        Err(e) => fail(&format!("cannot find the envoy-types crate's protos: {e}")),
    };
    let includes: Vec<PathBuf> = [
        "data-plane-api",
        "xds",
        "protoc-gen-validate",
        "googleapis",
        "cel-spec/proto",
    ]
    .iter()
    .map(|d| envoy.join(d))
    .chain([ours])
    .collect();
    let set = match protox::compile(ROOTS, &includes) {
        Ok(set) => set,
        Err(e) => fail(&format!("compiling the service descriptors: {e}")),
    };
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    if let Err(e) = std::fs::write(out.join("descriptors.bin"), set.encode_to_vec()) {
        fail(&format!("writing the descriptor set: {e}"));
    }
}

/// The `proto` directory of the envoy-types package this build uses: first in the registry's
/// unpacked sources at the version Cargo.lock pins (no cargo call: on a fresh machine the other
/// workspace members' dev-dependencies are not downloaded yet, and `cargo metadata` would want
/// them), else as `cargo metadata` reports it (vendored or git sources), for this platform only.
fn envoy_types_protos(manifest_dir: &Path) -> Result<PathBuf, String> {
    if let Some(dir) = from_registry(manifest_dir) {
        return Ok(dir);
    }
    from_metadata(manifest_dir)
}

/// `$CARGO_HOME/registry/src/*/envoy-types-VERSION/proto`, VERSION read from Cargo.lock.
fn from_registry(manifest_dir: &Path) -> Option<PathBuf> {
    let lock = manifest_dir.join("../../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    let text = std::fs::read_to_string(lock).ok()?;
    let mut lines = text.lines();
    lines.find(|l| l.trim() == "name = \"envoy-types\"")?;
    let version = lines
        .next()?
        .trim()
        .strip_prefix("version = \"")?
        .strip_suffix('"')?
        .to_string();
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))?;
    std::fs::read_dir(home.join("registry/src"))
        .ok()?
        .flatten()
        .map(|index| index.path().join(format!("envoy-types-{version}/proto")))
        .find(|dir| dir.is_dir())
}

fn from_metadata(manifest_dir: &Path) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["metadata", "--format-version", "1", "--offline"]);
    if let Some(target) = std::env::var_os("TARGET") {
        cmd.arg("--filter-platform").arg(target);
    }
    let out = cmd
        .arg("--manifest-path")
        .arg(manifest_dir.join("Cargo.toml"))
        .output()
        .map_err(|e| format!("cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
    let manifest = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "envoy-types")
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("envoy-types is not among the dependencies")?;
    let dir = Path::new(manifest).with_file_name("proto");
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(format!("{} is missing", dir.display()))
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1);
}
