//! [`Bounded`]: the control server's connections, bounded in number and
//! in how long one may sit idle.
//!
//! The server runs in the process whose trials need descriptors for their
//! result files and checkpoints. Without bounds, a client (with or without
//! the token: refusing it takes reading its request first) that opens
//! connections and sends a byte now and then would hold a descriptor each,
//! until the runner could open no file and its trials failed. hyper's own
//! header timeout needs a timer that `axum::serve` does not give it, so the
//! bounds are kept here, below HTTP: at most [`MAX_CONNECTIONS`] at once
//! (the next wait in the kernel's backlog, costing this process nothing),
//! and a connection that neither sends nor takes a byte for [`IDLE`] is
//! closed. A page polls every second, so an open page never idles that
//! long; a browser opens a new connection when one was closed.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a connection may neither send nor take a byte before it is
/// closed.
pub const IDLE: Duration = Duration::from_secs(30);

/// A listener whose connections are bounded as the module says.
pub struct Bounded {
    listener: TcpListener,
    permits: Arc<Semaphore>,
    idle: Duration,
}

impl Bounded {
    /// Bounds the connections `listener` accepts.
    pub fn new(listener: TcpListener) -> Self {
        Self {
            listener,
            permits: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            idle: IDLE,
        }
    }
}

impl axum::serve::Listener for Bounded {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection, SocketAddr) {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        loop {
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    return (Connection::new(stream, permit, self.idle), addr);
                }
                // Out of descriptors, or a connection reset before it was
                // taken: try again shortly, without spinning.
                Err(e) => {
                    tracing::debug!("the control server could not accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// One connection, holding its place among [`MAX_CONNECTIONS`] until it is
/// dropped, and failing its reads and writes once it has been idle for
/// [`IDLE`].
pub struct Connection {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
}

impl Connection {
    fn new(stream: TcpStream, permit: OwnedSemaphorePermit, idle: Duration) -> Self {
        Self {
            stream,
            _permit: permit,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
        }
    }

    /// What a read or write that is still waiting becomes: an error once
    /// the connection has idled too long (the timer wakes the task then),
    /// and on progress, a new idle period.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(result) => {
                let next = Instant::now() + self.idle;
                self.timer.as_mut().reset(next);
                Poll::Ready(result)
            }
            Poll::Pending => match self.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the connection was idle too long",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        self.watch(cx, polled)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::serve::Listener as _;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn an_idle_connection_is_closed_and_frees_its_place() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut bounded = Bounded::new(listener);
        bounded.idle = Duration::from_millis(200);
        let addr = bounded.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (mut connection, _) = bounded.accept().await;
        assert_eq!(bounded.permits.available_permits(), MAX_CONNECTIONS - 1);
        let mut byte = [0u8; 1];
        // A byte that arrives is read; then nothing arrives, and the read
        // fails once the connection has idled for its period.
        use tokio::io::AsyncWriteExt;
        let mut client = client;
        client.write_all(b"x").await.unwrap();
        assert_eq!(connection.read(&mut byte).await.unwrap(), 1);
        let started = Instant::now();
        let err = connection.read(&mut byte).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= bounded.idle);
        drop(connection);
        assert_eq!(bounded.permits.available_permits(), MAX_CONNECTIONS);
    }
}
