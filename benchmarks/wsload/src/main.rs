//! wsload: the WebSocket load client of benchmarks/websocket.py (refork issue 11).
//!
//! Two modes, one JSON line on stdout at the end (the idle mode prints one more when all its
//! connections are open):
//!
//!   wsload echo --url ws://127.0.0.1:PORT/ [--clients 32] [--duration 10] [--warmup 2]
//!               [--setup 2] [--size 32] [--threads 1]
//!       Each client sends a text message and waits for its echo, in a loop. Reports messages per
//!       second over the measured window (it begins --setup + --warmup seconds after the start),
//!       round-trip p50/p99/max and the client's own CPU time over that window (getrusage), so the
//!       caller can check that the client is not the bottleneck.
//!
//!   wsload idle --url ws://127.0.0.1:PORT/ [--connections 1000] [--concurrency 50]
//!               [--ping-interval 5] [--hold 300]
//!       Opens N connections (at most --concurrency handshakes at a time), prints
//!       {"event":"open",...} when all are open, then keeps them idle (one ping per connection every
//!       --ping-interval seconds, 0 = never; the server's own pings are answered) until a line or EOF
//!       on stdin, or --hold seconds. Then closes them all (close handshake) and prints the summary.
//!
//! Loopback only, bounded: every mode stops by itself.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::io::AsyncBufReadExt;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};
use tokio_tungstenite::tungstenite::{Bytes, Message};
use tokio_tungstenite::{WebSocketStream, client_async};

struct Args {
    mode: String,
    url: String,
    clients: usize,
    duration: f64,
    warmup: f64,
    setup: f64,
    size: usize,
    threads: usize,
    connections: usize,
    concurrency: usize,
    ping_interval: f64,
    hold: f64,
}

fn usage(msg: &str) -> ! {
    eprintln!("wsload: {msg}");
    eprintln!("usage: wsload echo|idle --url ws://127.0.0.1:PORT/ [options] (see src/main.rs)");
    std::process::exit(2);
}

fn parse_args() -> Args {
    let mut argv = std::env::args().skip(1);
    let mode = argv.next().unwrap_or_else(|| usage("missing mode"));
    if mode != "echo" && mode != "idle" {
        usage(&format!("unknown mode {mode:?}"));
    }
    let mut a = Args {
        mode,
        url: String::new(),
        clients: 32,
        duration: 10.0,
        warmup: 2.0,
        setup: 2.0,
        size: 32,
        threads: 1,
        connections: 1000,
        concurrency: 50,
        ping_interval: 5.0,
        hold: 300.0,
    };
    while let Some(flag) = argv.next() {
        let value = argv.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        let num = || value.parse::<f64>().unwrap_or_else(|_| usage(&format!("{flag}: not a number: {value}")));
        match flag.as_str() {
            "--url" => a.url = value.clone(),
            "--clients" => a.clients = num() as usize,
            "--duration" => a.duration = num(),
            "--warmup" => a.warmup = num(),
            "--setup" => a.setup = num(),
            "--size" => a.size = num() as usize,
            "--threads" => a.threads = num() as usize,
            "--connections" => a.connections = num() as usize,
            "--concurrency" => a.concurrency = num() as usize,
            "--ping-interval" => a.ping_interval = num(),
            "--hold" => a.hold = num(),
            _ => usage(&format!("unknown option {flag}")),
        }
    }
    if a.url.is_empty() {
        usage("--url is required");
    }
    a
}

/// (user, system) CPU seconds of this process.
fn cpu_seconds() -> (f64, f64) {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    (secs(ru.ru_utime), secs(ru.ru_stime))
}

/// Raise the open-file limit to the hard limit (1,000 connections need more than 1,024 fds).
fn raise_nofile() {
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && rl.rlim_cur < rl.rlim_max {
            rl.rlim_cur = rl.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
        }
    }
}

type Ws = WebSocketStream<TcpStream>;

async fn connect(url: &str) -> Result<Ws, String> {
    let rest = url.strip_prefix("ws://").ok_or("only ws:// URLs")?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    let tcp = TcpStream::connect(hostport).await.map_err(|e| format!("connect: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| format!("nodelay: {e}"))?;
    let (ws, _resp) = client_async(url, tcp).await.map_err(|e| format!("handshake: {e}"))?;
    Ok(ws)
}

fn percentile(sorted: &[u32], p: f64) -> Option<u32> {
    if sorted.is_empty() {
        return None;
    }
    let idx = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    Some(sorted[idx.min(sorted.len() - 1)])
}

fn json_opt(v: Option<u32>) -> String {
    v.map_or("null".to_string(), |x| x.to_string())
}

// ----------------------------------------------------------------------------------------- echo

struct EchoOut {
    rtts_us: Vec<u32>,
    errors: u64,
    mismatches: u64,
    first_error: Option<String>,
}

async fn echo_client(url: String, id: usize, size: usize, start: Instant, end: Instant) -> EchoOut {
    let mut out = EchoOut { rtts_us: Vec::with_capacity(1 << 16), errors: 0, mismatches: 0, first_error: None };
    let mut ws = match connect(&url).await {
        Ok(ws) => ws,
        Err(e) => {
            out.errors += 1;
            out.first_error = Some(e);
            return out;
        }
    };
    let mut text = format!("client {id:04} says hello ");
    while text.len() < size {
        text.push('x');
    }
    text.truncate(size.max(1));
    let payload: tokio_tungstenite::tungstenite::Utf8Bytes = text.into();
    'outer: while Instant::now() < end {
        let t0 = Instant::now();
        if let Err(e) = ws.send(Message::Text(payload.clone())).await {
            out.errors += 1;
            out.first_error.get_or_insert(format!("send: {e}"));
            break;
        }
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    let t1 = Instant::now();
                    if t != payload {
                        out.mismatches += 1;
                    }
                    if t0 >= start && t1 <= end {
                        out.rtts_us.push((t1 - t0).as_micros().min(u32::MAX as u128) as u32);
                    }
                    break;
                }
                Some(Ok(Message::Binary(_))) => {
                    out.mismatches += 1;
                    break;
                }
                Some(Ok(Message::Close(frame))) => {
                    out.errors += 1;
                    out.first_error.get_or_insert(format!("server closed: {frame:?}"));
                    break 'outer;
                }
                Some(Ok(_)) => continue, // ping (answered by tungstenite on the next write), pong
                Some(Err(e)) => {
                    out.errors += 1;
                    out.first_error.get_or_insert(format!("receive: {e}"));
                    break 'outer;
                }
                None => {
                    out.errors += 1;
                    out.first_error.get_or_insert("connection ended".to_string());
                    break 'outer;
                }
            }
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), ws.close(None)).await;
    // Drain until the server's close frame (or EOF), so the server sees a clean close handshake.
    let _ = tokio::time::timeout(Duration::from_secs(2), async { while let Some(Ok(_)) = ws.next().await {} }).await;
    out
}

async fn run_echo(a: &Args) {
    // --setup: time to connect every client before the warm-up begins.
    let start = Instant::now() + Duration::from_secs_f64(a.setup + a.warmup);
    let end = start + Duration::from_secs_f64(a.duration);
    let mut handles = Vec::new();
    for id in 0..a.clients {
        handles.push(tokio::spawn(echo_client(a.url.clone(), id, a.size, start, end)));
    }
    tokio::time::sleep_until(start.into()).await;
    let cpu0 = cpu_seconds();
    tokio::time::sleep_until(end.into()).await;
    let cpu1 = cpu_seconds();
    let mut rtts: Vec<u32> = Vec::new();
    let (mut errors, mut mismatches, mut connected) = (0u64, 0u64, 0usize);
    let mut first_error: Option<String> = None;
    for h in handles {
        let out = h.await.expect("client task panicked");
        if out.first_error.as_deref().is_none_or(|e| !e.starts_with("connect") && !e.starts_with("handshake")) {
            connected += 1;
        }
        errors += out.errors;
        mismatches += out.mismatches;
        if first_error.is_none() {
            first_error = out.first_error;
        }
        rtts.extend(out.rtts_us);
    }
    rtts.sort_unstable();
    let total = cpu_seconds();
    let messages = rtts.len();
    let err = first_error.map_or("null".to_string(), |e| format!("{:?}", e));
    println!(
        "{{\"mode\":\"echo\",\"clients\":{},\"connected\":{},\"duration_s\":{},\"size\":{},\"threads\":{},\
         \"messages\":{},\"mps\":{:.1},\"p50_us\":{},\"p99_us\":{},\"max_us\":{},\"errors\":{},\
         \"mismatches\":{},\"cpu_user_s\":{:.3},\"cpu_sys_s\":{:.3},\"cpu_total_s\":{:.3},\"first_error\":{}}}",
        a.clients,
        connected,
        a.duration,
        a.size,
        a.threads,
        messages,
        messages as f64 / a.duration,
        json_opt(percentile(&rtts, 50.0)),
        json_opt(percentile(&rtts, 99.0)),
        json_opt(rtts.last().copied()),
        errors,
        mismatches,
        cpu1.0 - cpu0.0,
        cpu1.1 - cpu0.1,
        total.0 + total.1,
        err
    );
}

// ----------------------------------------------------------------------------------------- idle

#[derive(Default)]
struct IdleCounters {
    pongs: AtomicU64,
    dropped: AtomicU64,
    closed_clean: AtomicU64,
}

async fn idle_conn(
    mut ws: Ws,
    id: usize,
    ping_interval: f64,
    mut stop: watch::Receiver<bool>,
    counters: Arc<IdleCounters>,
) {
    let period = if ping_interval > 0.0 { Duration::from_secs_f64(ping_interval) } else { Duration::from_secs(86400) };
    // Spread the pings over the period instead of pinging every connection at once.
    let offset = period.mul_f64((id % 1000) as f64 / 1000.0);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period + offset, period);
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = tick.tick(), if ping_interval > 0.0 => {
                if ws.send(Message::Ping(Bytes::from_static(b"idle"))).await.is_err() {
                    counters.dropped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
            msg = ws.next() => match msg {
                Some(Ok(Message::Pong(_))) => { counters.pongs.fetch_add(1, Ordering::Relaxed); }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                    counters.dropped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Some(Ok(_)) => {} // the server's pings are answered by tungstenite on the next flush
            }
        }
    }
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        ws.close(None).await.ok()?;
        while let Some(Ok(_)) = ws.next().await {}
        Some(())
    })
    .await;
    if matches!(closed, Ok(Some(()))) {
        counters.closed_clean.fetch_add(1, Ordering::Relaxed);
    }
}

async fn run_idle(a: &Args) {
    let t0 = Instant::now();
    let sem = Arc::new(Semaphore::new(a.concurrency.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let counters = Arc::new(IdleCounters::default());
    let mut connecting = Vec::new();
    for id in 0..a.connections {
        let (sem, url) = (sem.clone(), a.url.clone());
        connecting.push(tokio::spawn(async move {
            let _permit = sem.acquire().await.expect("semaphore closed");
            // One retry: a loaded server's accept backlog may overflow during the burst.
            match connect(&url).await {
                Ok(ws) => Ok(ws),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    connect(&url).await
                }
            }
            .map(|ws| (id, ws))
        }));
    }
    let mut conns = Vec::new();
    let (mut failed, mut first_error) = (0usize, None::<String>);
    for h in connecting {
        match h.await.expect("connect task panicked") {
            Ok((id, ws)) => conns.push(tokio::spawn(idle_conn(ws, id, a.ping_interval, stop_rx.clone(), counters.clone()))),
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    let err = first_error.map_or("null".to_string(), |e| format!("{:?}", e));
    println!(
        "{{\"event\":\"open\",\"connections\":{},\"failed\":{},\"connect_s\":{:.3},\"first_error\":{}}}",
        conns.len(),
        failed,
        t0.elapsed().as_secs_f64(),
        err
    );
    std::io::stdout().flush().ok();

    // Hold until the caller says so (a line or EOF on stdin) or --hold seconds.
    let held = Instant::now();
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut line = String::new();
    let _ = tokio::time::timeout(Duration::from_secs_f64(a.hold), stdin.read_line(&mut line)).await;
    let held_s = held.elapsed().as_secs_f64();
    let dropped_before_close = counters.dropped.load(Ordering::Relaxed);

    let _ = stop_tx.send(true);
    let open = conns.len();
    for h in conns {
        let _ = h.await;
    }
    println!(
        "{{\"mode\":\"idle\",\"connections\":{},\"failed\":{},\"held_s\":{:.1},\"dropped\":{},\"pongs\":{},\
         \"closed_clean\":{}}}",
        open,
        failed,
        held_s,
        dropped_before_close,
        counters.pongs.load(Ordering::Relaxed),
        counters.closed_clean.load(Ordering::Relaxed)
    );
}

fn main() {
    let a = parse_args();
    raise_nofile();
    let rt = if a.threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(a.threads).enable_all().build()
    }
    .expect("tokio runtime");
    rt.block_on(async {
        if a.mode == "echo" { run_echo(&a).await } else { run_idle(&a).await }
    });
}
