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

/// The `proto` directory of the envoy-types package this build uses, as `cargo metadata`
/// reports it (registry, vendored or git sources alike).
fn envoy_types_protos(manifest_dir: &Path) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--manifest-path",
        ])
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
