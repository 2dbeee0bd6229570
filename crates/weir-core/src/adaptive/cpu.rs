//! CPU usage for BBR, read the way the process's limits see it.
//!
//! Inside a container the host's `/proc/stat` is the wrong signal: a container limited to 1 CPU
//! on a 16-core host that uses its whole CPU shows ≈ 6 % there, and BBR would never trigger
//! (aegis#18). [`CpuReader`] therefore prefers, in order:
//! 1. cgroup v2: `cpu.stat` `usage_usec` against `cpu.max` (quota / period CPUs, or the host's
//!    CPUs when `max`);
//! 2. cgroup v1: `cpuacct.usage` (ns) against `cpu.cfs_quota_us / cpu.cfs_period_us`;
//! 3. `/proc/stat`: busy / total jiffies of the whole host.
//!
//! [`CpuSampler`] reads it in a background thread (default every 500 ms) and smooths it
//! exponentially on the way down (new = max(sample, decay × previous + (1 − decay) × sample)),
//! publishing a value in [0, 1]: a rise is seen at the first sample, a dip fades out.
//! The default decay is 0.5, not kratos's 0.95: with 0.95 a saturated service needs ≈ 16 s of
//! samples before the smoothed value crosses 80 %, long enough for a queue to build that takes
//! as long again to drain (`weir simulate overload` shows it); with 0.5 it takes ≈ 1.2 s, and rising at once it takes one interval.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Something that knows the current CPU usage in [0, 1] (injectable for tests).
pub trait CpuSource: Send + Sync {
    /// Current usage, 0 = idle, 1 = all the CPU this process may use.
    fn usage(&self) -> f64;
}

impl<F: Fn() -> f64 + Send + Sync> CpuSource for F {
    fn usage(&self) -> f64 {
        self()
    }
}

/// Which accounting a reader uses.
#[derive(Debug, Clone, PartialEq)]
pub enum CpuAccounting {
    /// cgroup v2 directory (holding `cpu.stat`, `cpu.max`).
    CgroupV2(PathBuf),
    /// cgroup v1 `cpuacct` and `cpu` directories.
    CgroupV1 {
        /// Holds `cpuacct.usage`.
        cpuacct: PathBuf,
        /// Holds `cpu.cfs_quota_us` and `cpu.cfs_period_us`.
        cpu: PathBuf,
    },
    /// `/proc/stat`-format file of the whole host.
    ProcStat(PathBuf),
}

/// Reads cumulative CPU time and turns two readings into a usage.
#[derive(Debug)]
pub struct CpuReader {
    accounting: CpuAccounting,
    host_cpus: f64,
    last: Option<(f64, f64)>,
}

impl CpuReader {
    /// Detects the accounting of this process under the filesystem `root` ("/" normally).
    pub fn detect(root: &Path) -> Self {
        let host_cpus = std::thread::available_parallelism()
            .map(|n| n.get() as f64)
            .unwrap_or(1.0);
        let v2 = root.join("sys/fs/cgroup");
        let accounting = if v2.join("cpu.stat").exists() && v2.join("cpu.max").exists() {
            CpuAccounting::CgroupV2(v2)
        } else if root.join("sys/fs/cgroup/cpuacct/cpuacct.usage").exists() {
            CpuAccounting::CgroupV1 {
                cpuacct: root.join("sys/fs/cgroup/cpuacct"),
                cpu: root.join("sys/fs/cgroup/cpu"),
            }
        } else {
            CpuAccounting::ProcStat(root.join("proc/stat"))
        };
        Self::new(accounting, host_cpus)
    }

    /// A reader of `accounting` on a host with `host_cpus` CPUs.
    pub fn new(accounting: CpuAccounting, host_cpus: f64) -> Self {
        Self {
            accounting,
            host_cpus: host_cpus.max(1.0),
            last: None,
        }
    }

    /// What this reader reads.
    pub fn accounting(&self) -> &CpuAccounting {
        &self.accounting
    }

    /// (CPU-seconds used so far, CPUs available now) for cgroups, whose files count only usage;
    /// (busy jiffies, total jiffies) so far for `/proc/stat`.
    fn read(&self) -> Option<(f64, f64)> {
        let num = |p: &Path| -> Option<f64> { fs::read_to_string(p).ok()?.trim().parse().ok() };
        match &self.accounting {
            CpuAccounting::CgroupV2(dir) => {
                let stat = fs::read_to_string(dir.join("cpu.stat")).ok()?;
                let usage_us: f64 = stat
                    .lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))?
                    .trim()
                    .parse()
                    .ok()?;
                let max = fs::read_to_string(dir.join("cpu.max")).ok()?;
                let mut parts = max.split_whitespace();
                let quota = parts.next()?;
                let period: f64 = parts.next().unwrap_or("100000").parse().ok()?;
                let cpus = match quota {
                    "max" => self.host_cpus,
                    q => (q.parse::<f64>().ok()? / period).min(self.host_cpus),
                };
                Some((usage_us / 1e6, cpus))
            }
            CpuAccounting::CgroupV1 { cpuacct, cpu } => {
                let usage_ns = num(&cpuacct.join("cpuacct.usage"))?;
                let quota = num(&cpu.join("cpu.cfs_quota_us")).unwrap_or(-1.0);
                let period = num(&cpu.join("cpu.cfs_period_us")).unwrap_or(100_000.0);
                let cpus = if quota > 0.0 && period > 0.0 {
                    (quota / period).min(self.host_cpus)
                } else {
                    self.host_cpus
                };
                Some((usage_ns / 1e9, cpus))
            }
            CpuAccounting::ProcStat(path) => {
                let text = fs::read_to_string(path).ok()?;
                let line = text.lines().find(|l| l.starts_with("cpu "))?;
                let v: Vec<f64> = line
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|x| x.parse().ok())
                    .collect();
                if v.len() < 4 {
                    return None;
                }
                let total: f64 = v.iter().take(8).sum();
                let idle = v[3] + v.get(4).copied().unwrap_or(0.0);
                Some((total - idle, total))
            }
        }
    }

    /// Usage in [0, 1] since the previous call (`None` on the first call or if unreadable).
    /// `elapsed` is seconds since a fixed point, increasing.
    pub fn sample(&mut self, elapsed: f64) -> Option<f64> {
        let (a, b) = self.read()?;
        // For cgroups remember the wall time instead of the CPU count.
        let now = match self.accounting {
            CpuAccounting::ProcStat(_) => (a, b),
            _ => (a, elapsed),
        };
        let previous = self.last.replace(now)?;
        let used = now.0 - previous.0;
        let available = match self.accounting {
            CpuAccounting::ProcStat(_) => now.1 - previous.1,
            _ => (elapsed - previous.1) * b,
        };
        (available > 0.0).then(|| (used / available).clamp(0.0, 1.0))
    }
}

/// Background CPU sampling with kratos's smoothing. Stops when dropped.
#[derive(Debug)]
pub struct CpuSampler {
    value: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CpuSampler {
    /// Default smoothing (see the module documentation).
    pub const DEFAULT_DECAY: f64 = 0.5;

    /// Samples this process's CPU (see [`CpuReader::detect`]) every `interval`.
    pub fn start(interval: Duration) -> Self {
        Self::start_with(
            CpuReader::detect(Path::new("/")),
            interval,
            Self::DEFAULT_DECAY,
        )
    }

    /// Samples with `reader` every `interval`, smoothing with `decay` in [0, 1).
    pub fn start_with(mut reader: CpuReader, interval: Duration, decay: f64) -> Self {
        let decay = decay.clamp(0.0, 0.99);
        let value = Arc::new(AtomicU64::new(0f64.to_bits()));
        let stop = Arc::new(AtomicBool::new(false));
        let (v, s) = (value.clone(), stop.clone());
        let origin = Instant::now();
        let thread = std::thread::Builder::new()
            .name("weir-cpu".into())
            .spawn(move || {
                let mut smoothed = 0.0;
                reader.sample(origin.elapsed().as_secs_f64());
                while !s.load(Ordering::Relaxed) {
                    std::thread::park_timeout(interval);
                    if let Some(u) = reader.sample(origin.elapsed().as_secs_f64()) {
                        // Rise at once, fall smoothly: an overload must be seen at
                        // the first sample; a dip must not open the gate.
                        smoothed = (smoothed * decay + u * (1.0 - decay)).max(u);
                        v.store(f64::to_bits(smoothed), Ordering::Relaxed);
                    }
                }
            })
            .ok();
        Self {
            value,
            stop,
            thread,
        }
    }
}

impl CpuSource for CpuSampler {
    fn usage(&self) -> f64 {
        f64::from_bits(self.value.load(Ordering::Relaxed))
    }
}

impl Drop for CpuSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join(name), text).unwrap();
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("weir-cpu-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    /// A container limited to 1 CPU on a 16-core host, using all of it, reads 100 %.
    #[test]
    fn cgroup_v2_quota_is_the_denominator() {
        let root = tmp("v2");
        let cg = root.join("sys/fs/cgroup");
        write(&cg, "cpu.max", "100000 100000\n");
        write(&cg, "cpu.stat", "usage_usec 0\nuser_usec 0\n");
        let mut r = CpuReader::detect(&root);
        r.host_cpus = 16.0;
        assert!(matches!(r.accounting(), CpuAccounting::CgroupV2(_)));
        assert_eq!(r.sample(0.0), None);
        write(&cg, "cpu.stat", "usage_usec 1000000\nuser_usec 900000\n");
        assert_eq!(r.sample(1.0), Some(1.0));
        // Half a CPU used → 50 %; without a quota, the host's 16 CPUs are the denominator.
        write(&cg, "cpu.stat", "usage_usec 1500000\n");
        assert_eq!(r.sample(2.0), Some(0.5));
        write(&cg, "cpu.max", "max 100000\n");
        write(&cg, "cpu.stat", "usage_usec 3100000\n");
        assert_eq!(r.sample(3.0), Some(0.1));
        let _ = fs::remove_dir_all(root);
    }

    #[test]
    fn cgroup_v1_and_proc_stat() {
        let root = tmp("v1");
        write(&root.join("sys/fs/cgroup/cpuacct"), "cpuacct.usage", "0\n");
        write(
            &root.join("sys/fs/cgroup/cpu"),
            "cpu.cfs_quota_us",
            "200000\n",
        );
        write(
            &root.join("sys/fs/cgroup/cpu"),
            "cpu.cfs_period_us",
            "100000\n",
        );
        let mut r = CpuReader::detect(&root);
        r.host_cpus = 16.0;
        assert!(matches!(r.accounting(), CpuAccounting::CgroupV1 { .. }));
        r.sample(0.0);
        write(
            &root.join("sys/fs/cgroup/cpuacct"),
            "cpuacct.usage",
            "1000000000\n",
        );
        assert_eq!(r.sample(1.0), Some(0.5), "1 of 2 quota CPUs");

        let root2 = tmp("proc");
        write(
            &root2.join("proc"),
            "stat",
            "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3 4\n",
        );
        let mut p = CpuReader::detect(&root2);
        assert!(matches!(p.accounting(), CpuAccounting::ProcStat(_)));
        p.sample(0.0);
        write(
            &root2.join("proc"),
            "stat",
            "cpu  250 0 250 900 0 0 0 0 0 0\n",
        );
        assert_eq!(p.sample(1.0), Some(0.75));
        let _ = fs::remove_dir_all(root);
        let _ = fs::remove_dir_all(root2);
    }

    #[test]
    fn the_real_sampler_runs_and_stops() {
        let s = CpuSampler::start(Duration::from_millis(5));
        std::thread::sleep(Duration::from_millis(30));
        let u = s.usage();
        assert!((0.0..=1.0).contains(&u));
        drop(s); // joins the thread
    }
}
