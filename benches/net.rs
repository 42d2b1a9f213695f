//! The network allowlist's proxy: what it costs a download and a connect.
//!
//! Throughput: one 100 MB HTTP download from a server on the host's
//! loopback, by curl, four ways interleaved run by run: curl on the host
//! (plain fork/exec, no sandbox), curl in bwrap sharing the host's network,
//! and curl in `confine run --net allow:…`, once as plain HTTP forwarding
//! and once through a CONNECT tunnel (`curl -p`). curl's own
//! `speed_download` is the figure, so no sandbox's start is in it.
//!
//! Connect latency: Python opens a TCP connection and gets one byte echoed
//! back, 300 times per run: on the host (direct), in bwrap with the host's
//! network (direct), and in confine through the proxy (connect to the
//! proxy, CONNECT, the proxy's own connect upstream, the byte). The added
//! latency is confine's p50 less the host's.
//!
//! `cargo bench --bench net`. `NET_RUNS=N` rounds (default 5);
//! `NET_MB=N` the download's size (default 100). Rows whose tool is
//! missing are reported as such, never invented. Binaries run from fresh
//! copies, as an install would have them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};

fn bulk_server(bytes: u64) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for sock in l.incoming() {
            let Ok(mut sock) = sock else { continue };
            std::thread::spawn(move || {
                let mut req = [0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut req) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&req[..n]),
                    }
                }
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {bytes}\r\nconnection: close\r\n\r\n");
                if sock.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let chunk = vec![0x5au8; 1 << 20];
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    if sock.write_all(&chunk[..n]).is_err() {
                        return;
                    }
                    left -= n as u64;
                }
            });
        }
    });
    port
}

fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for sock in l.incoming() {
            let Ok(mut sock) = sock else { continue };
            let _ = sock.set_nodelay(true);
            std::thread::spawn(move || {
                let mut b = [0u8; 1];
                while let Ok(1) = sock.read(&mut b) {
                    if sock.write_all(&b).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

fn output(argv: &[String]) -> Option<String> {
    let out = Command::new(&argv[0]).args(&argv[1..]).stdin(Stdio::null()).output().ok()?;
    if !out.status.success() {
        eprintln!("{}: failed: {}", argv.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn median_range(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    (s[s.len() / 2], s[0], s[s.len() - 1])
}

const LATENCY_PY: &str = r#"
import socket, sys, time
mode, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
samples = []
for i in range(n + 20):
    t0 = time.perf_counter()
    if mode == "direct":
        s = socket.create_connection(("127.0.0.1", port))
    else:
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % port)
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        assert head.startswith(b"HTTP/1.1 200"), head
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"x")
    assert s.recv(1) == b"x"
    dt = time.perf_counter() - t0
    s.close()
    if i >= 20:
        samples.append(dt)
samples.sort()
print("%.1f %.1f" % (samples[len(samples) // 2] * 1e6, samples[int(len(samples) * 0.99)] * 1e6))
"#;

fn main() {
    let runs: usize = std::env::var("NET_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let mb: u64 = std::env::var("NET_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let dir = tempfile::tempdir().expect("tempdir");
    let confine = dir.path().join("confine");
    std::fs::copy(env!("CARGO_BIN_EXE_confine"), &confine).expect("copy confine");
    let confine = confine.display().to_string();
    let bulk = bulk_server(mb << 20);
    let echo = echo_server();
    let url = format!("http://127.0.0.1:{bulk}/data");
    let curl = |extra: &[&str]| -> Vec<String> {
        let mut v = vec!["curl", "-sS", "-o", "/dev/null", "-w", "%{speed_download}"];
        v.extend_from_slice(extra);
        v.push(&url);
        v.into_iter().map(String::from).collect()
    };
    let bwrap: Vec<String> =
        ["bwrap", "--unshare-all", "--share-net", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
            .map(String::from)
            .to_vec();
    let in_confine = |net: &str, argv: Vec<String>| -> Vec<String> {
        let mut v: Vec<String> =
            [confine.as_str(), "run", "--memory", "unlimited", "--net", net, "--"].map(String::from).to_vec();
        v.extend(argv);
        v
    };
    let with = |mut pre: Vec<String>, argv: Vec<String>| {
        pre.extend(argv);
        pre
    };
    if !have("curl") {
        eprintln!("curl: not found; nothing measured (apt-get install curl)");
        return;
    }
    let have_bwrap = have("bwrap");
    if !have_bwrap {
        eprintln!("bwrap: not measured (apt-get install bubblewrap)");
    }
    // +raw: the tunnel row carries plain HTTP, not TLS (curl -p).
    let allow_bulk = format!("allow:127.0.0.1:{bulk}+raw");
    let mut rows: Vec<(&str, Vec<String>, Vec<f64>)> = vec![
        ("curl on the host (plain fork/exec)", curl(&[]), Vec::new()),
        ("curl in bwrap --share-net (the host's network)", with(bwrap.clone(), curl(&[])), Vec::new()),
        ("curl in confine --net allow, plain HTTP via the proxy", in_confine(&allow_bulk, curl(&[])), Vec::new()),
        (
            "curl in confine --net allow, CONNECT tunnel (curl -p, +raw)",
            in_confine(&allow_bulk, curl(&["-p"])),
            Vec::new(),
        ),
    ];
    if !have_bwrap {
        rows.remove(1);
    }
    eprintln!("throughput: {mb} MB from 127.0.0.1:{bulk}, {runs} rounds, interleaved");
    for round in 0..runs {
        for (name, argv, samples) in rows.iter_mut() {
            match output(argv).and_then(|s| s.parse::<f64>().ok()) {
                Some(bps) => samples.push(bps / 1e6),
                None => eprintln!("{name}: round {round} not measured"),
            }
        }
    }
    let direct = rows[0].2.clone();
    let (d50, _, _) = if direct.is_empty() { (f64::NAN, 0.0, 0.0) } else { median_range(&direct) };
    println!("\n| {mb} MB download, {runs} rounds | median MB/s | range | of direct |");
    println!("|---|---:|---:|---:|");
    for (name, _, samples) in &rows {
        if samples.is_empty() {
            println!("| {name} | not measured | | |");
            continue;
        }
        let (m, lo, hi) = median_range(samples);
        println!("| {name} | {m:.0} | {lo:.0}–{hi:.0} | {:.0}% |", 100.0 * m / d50);
    }

    let py = "/usr/bin/python3";
    if !std::path::Path::new(py).exists() {
        eprintln!("python3: not found; latency not measured");
        return;
    }
    let n = "300";
    let port = echo.to_string();
    let script =
        |mode: &str| -> Vec<String> { [py, "-c", LATENCY_PY, mode, port.as_str(), n].map(String::from).to_vec() };
    let allow_echo = format!("allow:127.0.0.1:{echo}+raw");
    type LatencyRow<'a> = (&'a str, Vec<String>, Vec<(f64, f64)>);
    let mut lat: Vec<LatencyRow> = vec![
        ("connect + 1-byte echo, on the host", script("direct"), Vec::new()),
        ("the same in bwrap --share-net", with(bwrap.clone(), script("direct")), Vec::new()),
        (
            "the same in confine --net allow, through the proxy (CONNECT)",
            in_confine(&allow_echo, script("proxy")),
            Vec::new(),
        ),
    ];
    if !have_bwrap {
        lat.remove(1);
    }
    eprintln!("latency: {n} connects per run, {runs} rounds, interleaved");
    for _ in 0..runs {
        for (name, argv, samples) in lat.iter_mut() {
            let got = output(argv).and_then(|s| {
                let mut it = s.split_whitespace().map(|x| x.parse::<f64>().ok());
                Some((it.next()??, it.next()??))
            });
            match got {
                Some(p) => samples.push(p),
                None => eprintln!("{name}: not measured"),
            }
        }
    }
    println!("\n| connect latency, {n} per run, {runs} rounds | p50 µs (median of runs) | range | p99 µs (median) |");
    println!("|---|---:|---:|---:|");
    let mut host50 = f64::NAN;
    for (i, (name, _, samples)) in lat.iter().enumerate() {
        if samples.is_empty() {
            println!("| {name} | not measured | | |");
            continue;
        }
        let p50: Vec<f64> = samples.iter().map(|s| s.0).collect();
        let p99: Vec<f64> = samples.iter().map(|s| s.1).collect();
        let (m, lo, hi) = median_range(&p50);
        if i == 0 {
            host50 = m;
        }
        println!("| {name} | {m:.0} | {lo:.0}–{hi:.0} | {:.0} |", median_range(&p99).0);
    }
    if let Some((_, _, s)) = lat.last() {
        if !s.is_empty() && host50.is_finite() {
            let p50: Vec<f64> = s.iter().map(|s| s.0).collect();
            println!("\nadded by the proxy, p50: {:.0} µs", median_range(&p50).0 - host50);
        }
    }
}
