//! A TCP proxy that delays every byte by a fixed time in each direction: the network between a
//! relay and its Postgres or Kafka, which loopback does not have. Bytes are forwarded in order,
//! each chunk once its delay is up (tokio's timer rounds up to the millisecond); the proxy
//! buffers without bound instead of passing on the receiver's flow control, which a bench's
//! bounded traffic allows. It runs on one thread of its own, whose id [`start`] returns so its
//! CPU time can be told apart.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Starts a proxy on a free loopback port forwarding to `upstream`, each direction delayed by
/// `one_way`; returns its address and its thread's id (Linux, `/proc/self/task/<id>`).
pub fn start(upstream: SocketAddr, one_way: Duration) -> (SocketAddr, Option<u32>) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let tid = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse().ok());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send((listener.local_addr().unwrap(), tid)).unwrap();
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    // Out of descriptors, say: give the other connections time to close.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::spawn(pipe(cr, sw, one_way));
                    tokio::spawn(pipe(sr, cw, one_way));
                });
            }
        });
    });
    rx.recv().unwrap()
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}
