//! HTTP/1 serving with bounds, for every listener the library opens (the admin server and the
//! `/metrics` listener): at most `max_connections` at once and `max_per_peer` from one address
//! (more are closed as they are accepted, so one client cannot hold every slot), request headers within `header_timeout` (hyper's timer, restarted for every
//! request on a kept-alive connection), and no connection with nothing read or written for
//! `idle_timeout` while no request of it is being worked on (a reader that stalls a response
//! is let go; a slow handler is not). At shutdown the listener closes at once and open
//! connections get [`SHUTDOWN_GRACE`] to finish.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long open connections get to finish at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The bounds of one listener.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub max_connections: usize,
    /// Open connections from one peer address at most: one client cannot take every slot.
    pub max_per_peer: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Limits {
    /// The `/metrics` listener's: a scraper or two, and whoever else finds the port.
    pub(crate) fn metrics() -> Self {
        Self {
            max_connections: 32,
            max_per_peer: 16,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// Whether a `Host` header value may be served: absent, an IP literal, `localhost`, or one of
/// `allowed` (any port, names compared without case).
pub(crate) fn host_allowed(host: Option<&str>, allowed: &[String]) -> bool {
    let Some(host) = host else { return true };
    if let Some(v6) = host.strip_prefix('[') {
        // [v6]:port
        return v6
            .split_once(']')
            .is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok());
    }
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let name = name.trim_end_matches('.');
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// One open connection counted against its peer's share; given back on drop.
struct PeerShare {
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl PeerShare {
    /// Counts a connection from `ip`, unless it already has `max` open.
    fn take(peers: &Arc<Mutex<HashMap<IpAddr, usize>>>, ip: IpAddr, max: usize) -> Option<Self> {
        let mut open = peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Self {
            peers: peers.clone(),
            ip,
        })
    }
}

impl Drop for PeerShare {
    fn drop(&mut self) {
        let mut open = self
            .peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// A stream that records when it last moved a byte.
struct Watched<S> {
    io: S,
    epoch: Instant,
    last: Arc<AtomicU64>,
}

impl<S> Watched<S> {
    fn touch(&self) {
        self.last
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Counts a request of a connection as worked on until its handler answers (or is dropped).
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn new(n: &Arc<AtomicUsize>) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        Self(n.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` resolves.
pub(crate) async fn run(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: &Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Whatever a library caller set: a zero would disable the bound or spin the watchdog.
    let max_connections = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let limits = Limits {
        max_connections,
        max_per_peer: limits.max_per_peer.clamp(1, max_connections),
        header_timeout: limits.header_timeout.max(Duration::from_millis(100)),
        idle_timeout: limits.idle_timeout.max(Duration::from_secs(1)),
    };
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let peers = Arc::new(Mutex::new(HashMap::<IpAddr, usize>::new()));
    let stop = CancellationToken::new();
    let tracker = TaskTracker::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors and the like: wait rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(share) = PeerShare::take(&peers, peer.ip(), limits.max_per_peer) else {
            tracing::debug!(%peer, "connection refused: this peer's share of the cap is taken");
            drop(stream);
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "connection refused: at the connection cap");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (app, stop, limits) = (app.clone(), stop.clone(), limits.clone());
        tracker.spawn(async move {
            serve_one(stream, peer, app, &limits, &stop).await;
            drop(permit);
            drop(share);
        });
    }
    // New clients are refused at once, not left waiting during the grace period.
    drop(listener);
    stop.cancel();
    tracker.close();
    tracker.wait().await;
    Ok(())
}

async fn serve_one(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    app: axum::Router,
    limits: &Limits,
    stop: &CancellationToken,
) {
    let epoch = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let busy = Arc::new(AtomicUsize::new(0));
    let io = Watched {
        io: stream,
        epoch,
        last: last.clone(),
    };
    let inner = hyper_util::service::TowerToHyperService::new(app);
    let working = busy.clone();
    let svc = hyper::service::service_fn(move |req| {
        let guard = Busy::new(&working);
        let answer = hyper::service::Service::call(&inner, req);
        async move {
            let r = answer.await;
            drop(guard);
            r
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let idle = limits.idle_timeout;
    let mut check = tokio::time::interval(Duration::from_secs(1).min(idle));
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended");
                }
                return;
            }
            _ = check.tick() => {
                if busy.load(Ordering::Relaxed) > 0 {
                    // A handler is working: the silence is ours, not the client's.
                    last.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
                    continue;
                }
                let quiet = epoch
                    .elapsed()
                    .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
                if quiet >= idle {
                    tracing::debug!(%peer, "connection idle: closed");
                    return;
                }
            }
            () = stop.cancelled() => {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(SHUTDOWN_GRACE, conn.as_mut()).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn hosts_by_ip_localhost_or_allow_list_only() {
        let allowed = vec!["outbox-admin.svc".to_owned()];
        for ok in [
            None,
            Some("127.0.0.1:8080"),
            Some("10.1.2.3"),
            Some("[::1]:8080"),
            Some("localhost:8080"),
            Some("LOCALHOST"),
            Some("outbox-admin.svc:8080"),
            Some("Outbox-Admin.SVC."),
        ] {
            assert!(host_allowed(ok, &allowed), "{ok:?}");
        }
        for bad in [
            Some("evil.example:8080"),
            Some("evil.example"),
            Some("localhost.evil.example"),
            Some("127.0.0.1.nip.io"),
            Some("[evil]:80"),
            Some(""),
        ] {
            assert!(!host_allowed(bad, &allowed), "{bad:?}");
        }
    }
}
