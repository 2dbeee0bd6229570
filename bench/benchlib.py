"""Helpers shared by the bench scripts: tools unpacked from Debian packages into the cache,
free loopback ports, waiting for a listener, and a bounded wrk run."""
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("WEIR_CACHE", Path.home() / ".cache/weir"))
LIB = "usr/lib/x86_64-linux-gnu"


def unpacked(name, packages, binary):
    root = CACHE / name
    path = root / "usr/bin" / binary
    if not path.exists():
        debs = CACHE / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", *packages], cwd=debs, check=True, capture_output=True)
        for deb in debs.glob("*.deb"):
            if any(deb.name.startswith(p + "_") for p in packages):
                subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    env = dict(os.environ, LD_LIBRARY_PATH=str(root / LIB))
    return str(path), env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"bench: nothing listens on {port}")


def wrk_run(wrk, env, port, secs, path="/", conns=32):
    """wrk -t2 -c`conns` for `secs` seconds: requests/s, p99 in ms, non-2xx count."""
    out = subprocess.run([wrk, "-t2", f"-c{conns}", f"-d{secs}s", "--latency", f"http://127.0.0.1:{port}{path}"],
                         capture_output=True, text=True, env=env, check=True, timeout=secs + 60).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p99_ms": float(p99.group(1)) * scale, "non2xx": int(non2xx.group(1)) if non2xx else 0}




def h2load_get(h2load, env, port, conns, streams, secs):
    """h2load GETs over HTTP/2 (h2c, prior knowledge) from one thread, `conns` connections ×
    `streams` streams for `secs` seconds: requests/s, mean and max request time (ms), failed
    and non-2xx counts."""
    out = subprocess.run([h2load, "-D", str(secs), "-c", str(conns), "-m", str(streams), "-t", "1",
                          f"http://127.0.0.1:{port}/"], capture_output=True, text=True, env=env, check=True,
                         timeout=secs + 60).stdout
    rps = float(re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out).group(1))
    t = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", out)
    failed = int(re.search(r"(\d+) failed", out).group(1))
    codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)

    def ms(v):
        m = re.match(r"([\d.]+)(us|ms|s)", v)
        return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
    non2xx = sum(int(codes.group(i)) for i in (2, 3, 4)) if codes else 0
    return {"rps": rps, "mean_ms": ms(t.group(3)), "max_ms": ms(t.group(2)), "failed": failed, "non2xx": non2xx}


def cpu_split(pid):
    """User and system CPU seconds used so far by process `pid` and its child processes (nginx's
    workers): (0, 0) for processes gone."""
    tck = os.sysconf("SC_CLK_TCK")
    user = system = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat.parent.name == str(pid) or fields[1] == str(pid):
            user += int(fields[11])
            system += int(fields[12])
    return user / tck, system / tck


def cpu_seconds(pid):
    """User + system CPU seconds used so far by process `pid` (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds():
    """CPU seconds of this script's finished (waited-for) children, e.g. wrk after its run."""
    import resource
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
