//! Real `redis-server` processes on free loopback ports, stopped on drop.
//!
//! The binary is `redis-server` from PATH, else the copy `scripts/test` unpacks into
//! `$WEIR_CACHE/redis` (default `~/.cache/weir/redis`).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn cache() -> PathBuf {
    std::env::var_os("WEIR_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/weir")
        })
}

/// (binary dir or None for PATH, LD_LIBRARY_PATH to add)
fn location(tool: &str) -> Command {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    if on_path {
        return Command::new(tool);
    }
    let root = cache().join("redis");
    let bin = root.join("usr/bin").join(tool);
    assert!(
        bin.exists(),
        "{tool} not found on PATH nor in {}: run scripts/test, which installs it",
        root.display()
    );
    let mut c = Command::new(bin);
    c.env("LD_LIBRARY_PATH", root.join("usr/lib/x86_64-linux-gnu"));
    c
}

/// A free loopback port (bound then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Sends one inline command, answers the raw reply.
pub fn raw(port: u16, cmd: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().unwrap(),
        Duration::from_millis(200),
    )?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    s.write_all(format!("{cmd}\r\n").as_bytes())?;
    let mut buf = vec![0u8; 1 << 16];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// One redis-server.
pub struct Redis {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    cluster: bool,
    retries: u32,
}

impl Redis {
    /// Starts a standalone server.
    pub fn start() -> Self {
        Self::start_on(free_port(), false)
    }

    /// Starts a server on `port`, in cluster mode if asked.
    pub fn start_on(port: u16, cluster: bool) -> Self {
        let dir = std::env::temp_dir().join(format!("weir-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = Self {
            port,
            child: None,
            dir,
            cluster,
            retries: 0,
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let mut cmd = location("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.cluster {
            cmd.args(["--cluster-enabled", "yes", "--cluster-config-file"])
                .arg(format!("nodes-{}.conf", self.port));
        }
        let child = cmd.spawn().expect("start redis-server");
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // Answering PING is not enough: another process may have taken the port between
            // `free_port` and our bind. The server must be ours.
            if raw(self.port, "INFO server")
                .is_ok_and(|r| r.contains(&format!("process_id:{pid}\r\n")))
            {
                return;
            }
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                break; // ours exited: the port was taken
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        assert!(
            self.retries < 5,
            "redis-server did not start on a free port after 5 tries"
        );
        self.retries += 1;
        self.port = free_port();
        self.spawn();
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port (empty: nothing is persisted).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP (`stop = true`) or SIGCONT: a server that accepts connections but never answers.
    pub fn pause(&self, stop: bool) {
        let pid = self.child.as_ref().unwrap().id();
        let sig = if stop { "-STOP" } else { "-CONT" };
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A 3-master Redis Cluster on loopback.
pub struct Cluster {
    pub nodes: Vec<Redis>,
}

impl Cluster {
    pub fn start() -> Self {
        let nodes: Vec<Redis> = (0..3).map(|_| Redis::start_on(free_port(), true)).collect();
        let mut cmd = location("redis-cli");
        cmd.args(["--cluster", "create"]);
        for n in &nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = cmd
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        'wait: while Instant::now() < deadline {
            for n in &nodes {
                if !raw(n.port, "CLUSTER INFO").is_ok_and(|r| r.contains("cluster_state:ok")) {
                    std::thread::sleep(Duration::from_millis(100));
                    continue 'wait;
                }
            }
            return Self { nodes };
        }
        panic!("cluster did not reach cluster_state:ok in 20 s");
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn url(&self) -> String {
        let list: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", list.join(","))
    }
}
