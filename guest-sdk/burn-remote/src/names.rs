//! Names burn's `remote` feature imports from burn-remote to connect to
//! network servers. A guest has no network: every connection is refused.

use core::fmt;
use core::future::{Future, ready};

use crate::RemoteDevice;

macro_rules! unused_names {
    ($($name:ident),*) => {
        $(
            /// Part of burn-remote's network API; a wtune guest has no network.
            #[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
            pub struct $name;
        )*
    };
}

unused_names!(
    Credential,
    CustomOpClient,
    Endpoint,
    EndpointAddr,
    EndpointId,
    IrohHost,
    IrohIdentity,
    IrohRelays,
    RelayUrl,
    InvalidRelays
);

/// Why `burn::remote::RemoteHost` connects nowhere.
#[derive(Debug)]
pub struct ConnectError;

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a wtune guest reaches no network servers: use burn_remote::RemoteDevice, \
             which is the wtune host",
        )
    }
}

type Connection<T> = Result<T, ConnectError>;

/// burn's `RemoteHost` wraps one of these; every connection fails with
/// [`ConnectError`].
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostSpec;

impl HostSpec {
    pub fn websocket(_url: &str) -> Self {
        HostSpec
    }

    pub fn iroh(_host: impl Into<IrohHost>) -> Self {
        HostSpec
    }

    pub fn with_credential(self, _credential: impl Into<Credential>) -> Self {
        self
    }

    pub fn connect(&self, _index: usize) -> Connection<RemoteDevice> {
        Err(ConnectError)
    }

    pub fn devices(&self) -> Connection<Vec<RemoteDevice>> {
        Err(ConnectError)
    }

    pub fn connect_async(
        &self,
        _index: usize,
    ) -> impl Future<Output = Connection<RemoteDevice>> + Send + 'static + use<> {
        ready(Err(ConnectError))
    }

    pub fn devices_async(
        &self,
    ) -> impl Future<Output = Connection<Vec<RemoteDevice>>> + Send + 'static + use<> {
        ready(Err(ConnectError))
    }
}
