//! The deployment files of `deploy/`, as far as a test machine can run them: no container runtime
//! and no Kubernetes are assumed, so the manifests are parsed and checked, every configuration they
//! carry passes `weir check-config`, and the exact command lines of the Dockerfile, the systemd
//! unit and the manifests are run against the binary (ports and paths replaced) until their
//! health endpoint answers.

use crate::{common, support};

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weir-deploy-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The YAML documents of a manifest file, as JSON values.
fn documents(path: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(repo(path)).unwrap();
    text.split("\n---\n")
        .map(|doc| {
            weir_rules::yaml::parse::<serde_json::Value>(Path::new(path), doc)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the binary with `args` and waits (10 s at most) until `GET /healthz` on `health`
/// answers 200.
fn run_until_healthy(args: &[String], health: u16) -> Running {
    let child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("weir starts");
    let mut r = Running(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", health)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            if out.starts_with("HTTP/1.1 200") {
                return r;
            }
        }
        if let Ok(Some(status)) = r.0.try_wait() {
            panic!("weir {args:?} exited: {status}");
        }
        assert!(Instant::now() < deadline, "weir {args:?} never healthy");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `weir check-config FILE` succeeds.
fn check_config(file: &Path) {
    let out = common::run(&["check-config", file.to_str().unwrap()], "");
    assert!(
        out.status.success(),
        "{}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes every ConfigMap's files to `dir` (checked by `weir check-config`); answers them.
fn config_maps(docs: &[serde_json::Value], dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in docs.iter().filter(|d| d["kind"] == "ConfigMap") {
        for (name, body) in d["data"].as_object().unwrap() {
            let f = dir.join(name);
            std::fs::write(&f, body.as_str().unwrap()).unwrap();
            check_config(&f);
            out.push(f);
        }
    }
    out
}

/// A container's args with the listen addresses moved to free loopback ports and the
/// mounted files moved to `dir`: (args, {original port → new port}).
fn localise(args: &[String], dir: &Path) -> (Vec<String>, Vec<(u16, u16)>) {
    let mut ports = Vec::new();
    let args = args
        .iter()
        .map(|a| {
            let mut a = a.replace("/etc/weir/", &format!("{}/", dir.display()));
            if let Some(at) = a.find("0.0.0.0:") {
                let old: u16 = a[at + 8..].parse().unwrap();
                let new = support::free_port();
                ports.push((old, new));
                a = format!("{}127.0.0.1:{new}", &a[..at]);
            }
            a
        })
        .collect();
    (args, ports)
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn the_kubernetes_weir_serve_manifest_runs_as_written() {
    let docs = documents("deploy/kubernetes/weir-serve.yaml");
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["ConfigMap", "Deployment", "Service"]);
    let dir = temp("k8s-serve");
    config_maps(&docs, &dir);
    let pod = &docs[1]["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(
        pod["volumes"][0]["configMap"]["name"],
        docs[0]["metadata"]["name"]
    );
    let redis = support::Redis::start();
    let args: Vec<String> = strings(&c["args"])
        .into_iter()
        .map(|a| a.replace("redis://redis:6379", &redis.url()))
        .collect();
    let (args, ports) = localise(&args, &dir);
    let http = ports.iter().find(|(old, _)| *old == 8080).unwrap().1;
    let mut all = vec!["serve".to_string()];
    all.extend(args);
    let _w = run_until_healthy(&all, http);
    // The Service targets the container's named ports.
    let names: Vec<String> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    for p in docs[2]["spec"]["ports"].as_array().unwrap() {
        assert!(names.contains(&p["targetPort"].as_str().unwrap().to_string()));
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_kubernetes_proxy_sidecar_manifest_runs_as_written() {
    let docs = documents("deploy/kubernetes/weir-proxy-sidecar.yaml");
    let dir = temp("k8s-proxy");
    config_maps(&docs, &dir);
    let containers = docs[1]["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    let sidecar = containers
        .iter()
        .find(|c| c["name"] == "weir-proxy")
        .unwrap();
    assert_eq!(strings(&sidecar["command"]), ["/usr/local/bin/weir"]);
    let upstream = common::http1_upstream(|_, _| "app".to_string());
    let args: Vec<String> = strings(&sidecar["args"])
        .into_iter()
        .map(|a| a.replace("127.0.0.1:9000", &format!("127.0.0.1:{upstream}")))
        .collect();
    let (args, ports) = localise(&args, &dir);
    let admin = ports.iter().find(|(old, _)| *old == 9901).unwrap().1;
    let _p = run_until_healthy(&args, admin);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_systemd_unit_and_the_dockerfile_command_lines_run() {
    let dir = temp("unit");
    let example = repo("crates/weir-server/config/example.yaml");
    check_config(&example);
    // The unit's ExecStart, the binary and paths replaced.
    let unit = std::fs::read_to_string(repo("deploy/systemd/weir-serve.service")).unwrap();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap();
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/weir"));
    std::fs::copy(&example, dir.join("ratelimit.yaml")).unwrap();
    let (grpc, http) = (support::free_port(), support::free_port());
    let args: Vec<String> = words
        .map(|w| {
            w.replace("/etc/weir/", &format!("{}/", dir.display()))
                .replace("127.0.0.1:8081", &format!("127.0.0.1:{grpc}"))
                .replace("127.0.0.1:8080", &format!("127.0.0.1:{http}"))
        })
        .collect();
    drop(run_until_healthy(&args, http));
    // The Dockerfile: what it copies exists, and its entry point with its CMD runs.
    let docker = std::fs::read_to_string(repo("deploy/docker/Dockerfile")).unwrap();
    assert!(docker.contains("COPY crates/weir-server/config/example.yaml /etc/weir/ratelimit.yaml"));
    // Envoy Gateway runs /bin/ratelimit (/bin is /usr/bin on Debian): the link to weir.
    assert!(docker.contains("RUN ln -s /usr/local/bin/weir /usr/bin/ratelimit"));
    let json = |prefix: &str| -> Vec<String> {
        let line = docker.lines().find_map(|l| l.strip_prefix(prefix)).unwrap();
        serde_json::from_str(line.trim()).unwrap()
    };
    let entry = json("ENTRYPOINT ");
    assert_eq!(entry[0], "/usr/local/bin/weir");
    let mut args: Vec<String> = entry[1..].to_vec();
    args.extend(json("CMD "));
    let (args, ports) = localise(&args, &dir);
    let http = ports.iter().find(|(old, _)| *old == 8080).unwrap().1;
    drop(run_until_healthy(&args, http));
    let _ = std::fs::remove_dir_all(dir);
}

/// The Helm values for Envoy Gateway: the rate-limit image and a Redis backend, at the keys
/// gateway-helm reads.
#[test]
fn envoy_gateway_values_name_the_image_and_redis() {
    let text = std::fs::read_to_string(repo("deploy/envoy-gateway/values.yaml")).unwrap();
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let image = &v["global"]["images"]["ratelimit"]["image"];
    assert!(
        image.as_str().is_some_and(|i| i.contains("weir")),
        "{image:?}"
    );
    let backend = &v["config"]["envoyGateway"]["rateLimit"]["backend"];
    assert_eq!(backend["type"].as_str(), Some("Redis"));
    assert!(backend["redis"]["url"].as_str().is_some());
}
