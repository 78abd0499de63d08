//! [`Bounded`]: the control server's connections, bounded in number and
//! in how long one may sit idle.
//!
//! The server runs in the process whose trials need descriptors for their
//! result files and checkpoints. Without bounds, a client (with or without
//! the token: refusing it takes reading its request first) that opens
//! connections and sends a byte now and then would hold a descriptor each,
//! until the runner could open no file and its trials failed. hyper's own
//! header timeout needs a timer that `axum::serve` does not give it, so the
//! bounds are kept here, below HTTP:
//! - at most [`MAX_CONNECTIONS`] at once (the next wait in the kernel's
//!   backlog, costing this process nothing);
//! - a connection that neither sends nor takes a byte for [`IDLE`] is
//!   closed. A page polls every second, so an open page never idles that
//!   long; a browser opens a new connection when one was closed;
//! - when every place is taken, a new connection takes the place of the one
//!   that has gone longest without taking a byte of an answer, if that is
//!   at least [`PATIENCE`]. A client trickling a byte of a request that never
//!   ends into every connection gets no answers, so it holds the places
//!   only until someone else comes; a page answered every second keeps its
//!   own.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
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

/// How long a connection may go without taking a byte of an answer before
/// a newcomer, finding every place taken, takes its place.
pub const PATIENCE: Duration = Duration::from_secs(5);

/// A listener whose connections are bounded as the module says.
pub struct Bounded {
    listener: TcpListener,
    permits: Arc<Semaphore>,
    places: Arc<Places>,
    /// A connection accepted and still waiting for a place, kept here so
    /// that an `accept` dropped while it waits does not lose it.
    arrived: Option<(TcpStream, SocketAddr)>,
    idle: Duration,
    patience: Duration,
}

impl Bounded {
    /// Bounds the connections `listener` accepts.
    pub fn new(listener: TcpListener) -> Self {
        Self {
            listener,
            permits: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            places: Arc::new(Places {
                started: Instant::now(),
                next: AtomicU64::new(0),
                live: Mutex::default(),
            }),
            arrived: None,
            idle: IDLE,
            patience: PATIENCE,
        }
    }

    /// A place for a connection just accepted: a free one, else the first
    /// to come free, evicting the connection answered longest ago as soon
    /// as it has gone [`PATIENCE`] without an answer.
    async fn place(&self) -> OwnedSemaphorePermit {
        loop {
            if let Ok(permit) = self.permits.clone().try_acquire_owned() {
                return permit;
            }
            let wait = self.places.evict_stalest(self.patience);
            let freed = tokio::time::timeout(wait, self.permits.clone().acquire_owned());
            if let Ok(permit) = freed.await {
                return permit.expect("the semaphore is never closed");
            }
        }
    }
}

impl axum::serve::Listener for Bounded {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection, SocketAddr) {
        while self.arrived.is_none() {
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    self.arrived = Some((stream, addr));
                }
                // Out of descriptors, or a connection reset before it was
                // taken: try again shortly, without spinning.
                Err(e) => {
                    tracing::debug!("the control server could not accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        // Accepted before it has a place: it may be the one that makes a
        // stale connection give its place up. Until it has one, no other is
        // accepted.
        let permit = self.place().await;
        let (stream, addr) = self.arrived.take().expect("a connection arrived");
        let entered = self.places.enter();
        (Connection::new(stream, permit, entered, self.idle), addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// The connections being served, as eviction sees them.
struct Places {
    /// What [`Watch::answered`] counts from.
    started: Instant,
    next: AtomicU64,
    live: Mutex<HashMap<u64, Arc<Watch>>>,
}

impl Places {
    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Watch>>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Registers a connection accepted now.
    fn enter(self: &Arc<Self>) -> Entered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let watch = Arc::new(Watch {
            answered: AtomicU64::new(self.now()),
            evicted: AtomicBool::new(false),
            waker: Mutex::new(None),
        });
        self.live().insert(id, watch.clone());
        Entered {
            places: self.clone(),
            id,
            watch,
        }
    }

    /// Evicts the connection answered longest ago, if that was at least
    /// `patience` ago. Returns how long to wait before trying again: until
    /// the stalest is stale, or `patience` when one was evicted (its place
    /// comes free as its task ends) or none is left to evict.
    fn evict_stalest(&self, patience: Duration) -> Duration {
        let now = self.now();
        let patience_ms = u64::try_from(patience.as_millis()).unwrap_or(u64::MAX);
        let live = self.live();
        // Ties (accepted in the same millisecond) go to the older.
        let stalest = live
            .iter()
            .filter(|(_, w)| !w.evicted.load(Ordering::Relaxed))
            .min_by_key(|(id, w)| (w.answered.load(Ordering::Relaxed), **id));
        let Some((_, watch)) = stalest else {
            return patience;
        };
        let unanswered = now.saturating_sub(watch.answered.load(Ordering::Relaxed));
        if unanswered < patience_ms {
            return Duration::from_millis(patience_ms - unanswered);
        }
        watch.evicted.store(true, Ordering::Relaxed);
        let waker = watch
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(waker) = waker {
            waker.wake();
        }
        patience
    }
}

/// What eviction knows of one connection.
struct Watch {
    /// When it last took a byte of an answer (or was accepted), in
    /// milliseconds since [`Places::started`].
    answered: AtomicU64,
    evicted: AtomicBool,
    /// The task waiting on the connection, woken when it is evicted. (hyper
    /// reads and writes a connection from one task.)
    waker: Mutex<Option<Waker>>,
}

/// A connection's entry in [`Places`], removed when the connection goes.
struct Entered {
    places: Arc<Places>,
    id: u64,
    watch: Arc<Watch>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.places.live().remove(&self.id);
    }
}

/// One connection, holding its place among [`MAX_CONNECTIONS`] until it is
/// dropped, and failing its reads and writes once it has been idle for
/// [`IDLE`].
pub struct Connection {
    stream: TcpStream,
    entered: Entered,
    // Dropped after `entered`: a newcomer given the place finds the
    // connection gone from the places.
    _permit: OwnedSemaphorePermit,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
}

impl Connection {
    fn new(
        stream: TcpStream,
        permit: OwnedSemaphorePermit,
        entered: Entered,
        idle: Duration,
    ) -> Self {
        Self {
            stream,
            entered,
            _permit: permit,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
        }
    }

    /// An error for every read and write once the connection was evicted;
    /// else `None`, with the task noted to be woken if it is.
    fn evicted<T>(&self, cx: &Context<'_>) -> Option<Poll<io::Result<T>>> {
        let watch = &self.entered.watch;
        let mut waker = watch.waker.lock().unwrap_or_else(PoisonError::into_inner);
        if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *waker = Some(cx.waker().clone());
        }
        drop(waker);
        watch.evicted.load(Ordering::Relaxed).then(|| {
            Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the connection went unanswered while another waited for its place",
            )))
        })
    }

    /// Notes that the connection took bytes of an answer.
    fn answered(&self, written: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(1..)) = written {
            let places = &self.entered.places;
            (self.entered.watch.answered).store(places.now(), Ordering::Relaxed);
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
        if let Some(evicted) = self.evicted(cx) {
            return evicted;
        }
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
        if let Some(evicted) = self.evicted(cx) {
            return evicted;
        }
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.answered(&polled);
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
        if let Some(evicted) = self.evicted(cx) {
            return evicted;
        }
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.answered(&polled);
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

    #[tokio::test]
    async fn a_newcomer_takes_the_place_of_the_connection_answered_longest_ago() {
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut bounded = Bounded::new(listener);
        bounded.patience = Duration::from_millis(300);
        let addr = bounded.local_addr().unwrap();
        let mut clients = Vec::new();
        let mut served = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            clients.push(TcpStream::connect(addr).await.unwrap());
            served.push(bounded.accept().await.0);
        }
        // Every place taken: the newest connections, and one that has just
        // been answered, are within their patience; the first-accepted
        // unanswered one is not.
        tokio::time::sleep(bounded.patience).await;
        served[0].write_all(b"answer").await.unwrap();
        clients.push(TcpStream::connect(addr).await.unwrap());
        // The evicted connection's task, as hyper's: it reads, meets the
        // error and drops the connection.
        let mut evicted = served.remove(1);
        let gone = tokio::spawn(async move { evicted.read(&mut [0u8; 1]).await.map(|_| ()) });
        let accepted = tokio::time::timeout(Duration::from_secs(10), bounded.accept()).await;
        let (mut newcomer, _) = accepted.expect("the newcomer was given a place");
        let gone = gone.await.unwrap().unwrap_err();
        assert_eq!(gone.kind(), io::ErrorKind::ConnectionAborted);
        let mut byte = [0u8; 1];
        assert_eq!(bounded.permits.available_permits(), 0);
        // The answered one and the newcomer still serve.
        clients[0].write_all(b"x").await.unwrap();
        assert_eq!(served[0].read(&mut byte).await.unwrap(), 1);
        clients[MAX_CONNECTIONS].write_all(b"y").await.unwrap();
        assert_eq!(newcomer.read(&mut byte).await.unwrap(), 1);
        assert_eq!(bounded.places.live().len(), MAX_CONNECTIONS);
    }

    #[tokio::test]
    async fn a_newcomer_waits_while_every_connection_was_answered_lately() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let bounded = Bounded::new(listener);
        let addr = bounded.local_addr().unwrap();
        let mut bounded = bounded;
        let mut clients = Vec::new();
        let mut served = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            clients.push(TcpStream::connect(addr).await.unwrap());
            served.push(bounded.accept().await.0);
        }
        clients.push(TcpStream::connect(addr).await.unwrap());
        let waited = tokio::time::timeout(Duration::from_millis(300), bounded.accept()).await;
        assert!(waited.is_err(), "a place was taken from a fresh connection");
        assert!(
            served
                .iter()
                .all(|c| !c.entered.watch.evicted.load(Ordering::Relaxed))
        );
        // A place that comes free goes to the newcomer.
        drop(served.pop());
        let newcomer = tokio::time::timeout(Duration::from_secs(10), bounded.accept()).await;
        assert!(newcomer.is_ok());
    }
}
