//! The gRPC reflection descriptors `weir serve` answers with (`src/grpc/descriptors.bin`) are
//! what the `.proto` files compile to: Envoy's RLS and RLQS from the envoy-types package this
//! workspace builds with, and the quota lease API from weir-quota's `proto/`. When a proto or
//! the envoy-types version changes, this test fails; `WEIR_WRITE_DESCRIPTORS=1` rewrites the
//! file (then commit it).

use std::path::{Path, PathBuf};
use std::process::Command;

use prost::Message;

const ROOTS: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
    "weir/quota/v1/quota.proto",
];

/// The `proto` directory of the envoy-types package the workspace builds with: in the
/// registry's unpacked sources at the version Cargo.lock pins, else where `cargo metadata` (for
/// this host only) says it is (vendored or git sources).
fn envoy_types_protos() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    if let Some(dir) = from_registry(&here.join("../../Cargo.lock")) {
        return dir;
    }
    let host = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .arg("-vV")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            v.lines()
                .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        })
        .expect("rustc -vV names the host");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
        ])
        .arg(host)
        .arg("--manifest-path")
        .arg(here.join("Cargo.toml"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let path = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "envoy-types")
        .and_then(|p| p["manifest_path"].as_str())
        .expect("envoy-types among the packages");
    Path::new(path).with_file_name("proto")
}

/// `$CARGO_HOME/registry/src/*/envoy-types-VERSION/proto`, VERSION read from `lock`.
fn from_registry(lock: &Path) -> Option<PathBuf> {
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

#[test]
fn reflection_descriptors_are_what_the_protos_compile_to() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let envoy = envoy_types_protos();
    let includes: Vec<PathBuf> = [
        "data-plane-api",
        "xds",
        "protoc-gen-validate",
        "googleapis",
        "cel-spec/proto",
    ]
    .iter()
    .map(|d| envoy.join(d))
    .chain([here.join("../weir-quota/proto")])
    .collect();
    let compiled = protox::compile(ROOTS, &includes)
        .expect("the protos compile")
        .encode_to_vec();
    let file = here.join("src/grpc/descriptors.bin");
    if std::env::var_os("WEIR_WRITE_DESCRIPTORS").is_some() {
        std::fs::write(&file, &compiled).unwrap();
    }
    let committed = std::fs::read(&file).unwrap();
    assert!(
        committed == compiled,
        "{} is not what the protos compile to ({} bytes against {}): run this test with WEIR_WRITE_DESCRIPTORS=1 and commit the file",
        file.display(),
        committed.len(),
        compiled.len()
    );
    assert_eq!(committed, weir_server::grpc::reflection::DESCRIPTORS);
}
