//! The control server and dashboard: an HTTP JSON API and a web page to
//! watch an experiment and, while it runs in this process, steer it (stop,
//! pause, resume and add trials; stop the experiment), as Ray Tune's
//! TuneServer does. `wtune run --serve` and `wtune resume --serve` start it
//! beside the runner; `wtune serve DIR` shows any experiment directory,
//! finished or running elsewhere, without control.
//!
//! The server reads what it shows from the experiment's files
//! ([`view`]) and sends control requests to the runner through a
//! [`Controller`], which the runner takes between steps; the API is in
//! `openapi.json` (also served at `/api/openapi.json`).

pub mod api;
mod connections;
pub mod view;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::tune::Controller;

/// Where `--serve` listens when no address is given: loopback only.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8267";

/// The environment variable that may hold the bearer token.
pub const TOKEN_ENV: &str = "WTUNE_SERVE_TOKEN";

/// How the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeOptions {
    /// Address and port; port 0 takes any free one.
    pub addr: SocketAddr,
    /// The bearer token every API request must carry; required unless the
    /// address is a loopback one.
    pub token: Option<String>,
}

impl ServeOptions {
    /// Refuses what would expose control of the experiment to the network.
    pub fn check(&self) -> Result<(), String> {
        match &self.token {
            Some(token) if token.trim().is_empty() => {
                Err("the server's token is empty; give a long random one".into())
            }
            Some(token) if token.len() < 16 => Err(format!(
                "the server's token has {} characters; give at least 16 (e.g. `openssl rand -hex 16`)",
                token.len()
            )),
            None if !self.addr.ip().is_loopback() => Err(format!(
                "{} is reachable from other machines, and the server controls the experiment: \
                 give a token with --serve-token or {TOKEN_ENV}, or listen on 127.0.0.1",
                self.addr
            )),
            _ => Ok(()),
        }
    }
}

/// A running server; it stops when dropped.
pub struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

/// A socket bound to a server's address and not yet served: a command
/// binds it before it changes anything, so that an address in use refuses
/// the command rather than failing it halfway ([`Server::start_on`]).
#[derive(Debug)]
pub struct Listener {
    socket: std::net::TcpListener,
    options: ServeOptions,
}

impl Listener {
    /// Checks `options` and binds its address. With `SO_REUSEADDR`, as
    /// tokio binds: a server stopped with its page open leaves connections
    /// in TIME_WAIT, which would keep the next command off the port.
    pub fn bind(options: &ServeOptions) -> Result<Self, String> {
        options.check()?;
        let listen = || -> std::io::Result<std::net::TcpListener> {
            let domain = socket2::Domain::for_address(options.addr);
            let socket = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
            #[cfg(unix)]
            socket.set_reuse_address(true)?;
            socket.bind(&options.addr.into())?;
            socket.listen(1024)?;
            socket.set_nonblocking(true)?;
            Ok(socket.into())
        };
        let socket = listen().map_err(|e| format!("cannot listen on {}: {e}", options.addr))?;
        Ok(Self {
            socket,
            options: options.clone(),
        })
    }

    /// Whether API requests must carry a token.
    pub fn tokened(&self) -> bool {
        self.options.token.is_some()
    }
}

impl Server {
    /// Binds `options.addr` and serves the experiment in `dir`, with
    /// control through `controller` when given. Must be called inside a
    /// tokio runtime; the server runs on it.
    pub async fn start(
        dir: PathBuf,
        controller: Option<Controller>,
        options: &ServeOptions,
    ) -> Result<Self, String> {
        Self::start_on(Listener::bind(options)?, dir, controller)
    }

    /// Serves the experiment in `dir` on `listener`, as [`Server::start`].
    /// Must be called inside a tokio runtime.
    pub fn start_on(
        listener: Listener,
        dir: PathBuf,
        controller: Option<Controller>,
    ) -> Result<Self, String> {
        let Listener { socket, options } = listener;
        let listening = |e: std::io::Error| format!("cannot listen on {}: {e}", options.addr);
        let addr = socket.local_addr().map_err(listening)?;
        let listener = tokio::net::TcpListener::from_std(socket).map_err(listening)?;
        let app = Arc::new(api::App {
            dir: view::ExperimentDir::new(dir),
            controller,
            token: options.token.as_deref().map(|t| blake3::hash(t.as_bytes())),
        });
        let router = api::router(app);
        let task = tokio::spawn(async move {
            if let Err(err) = axum::serve(connections::Bounded::new(listener), router).await {
                tracing::warn!("the control server stopped: {err}");
            }
        });
        Ok(Self { addr, task })
    }

    /// The address it listens on (with the port chosen, for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The dashboard's address.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod listener_tests {
    use super::*;

    /// A server that closed its connections first (Ctrl-C with the page
    /// open) leaves them in TIME_WAIT on its port; the next command binds
    /// the port all the same.
    #[test]
    fn a_port_just_served_can_be_bound_again() {
        let options = |port| ServeOptions {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            token: None,
        };
        let first = Listener::bind(&options(0)).unwrap();
        let addr = first.socket.local_addr().unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        first.socket.set_nonblocking(false).unwrap();
        let (served, _) = first.socket.accept().unwrap();
        // The server closes first: its side of the connection waits.
        drop(served);
        drop(first);
        drop(client);
        let again = Listener::bind(&options(addr.port()));
        assert!(again.is_ok(), "{:?}", again.err());
    }
}
