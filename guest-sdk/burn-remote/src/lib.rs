//! burn tensors whose operations the wtune host runs.
//!
//! A trainable built with burn picks where its tensors live through burn's
//! `Device`. With burn's `remote` feature and this crate patched in for
//! `burn-remote` (see its Cargo.toml), [`RemoteDevice`] is a device whose
//! operations are not run in the guest: each one is described as a burn-ir
//! [`OperationIr`](burn_ir::OperationIr), queued, and sent in batches to
//! a [`Transport`]. The guest sends operations and data, never code.
//!
//! In a wtune trainable, turn on this crate's `guest` feature and take the
//! device from [`host`] (it connects the client to the host's
//! `wtune:trainable/burn` interface); the host's `wtune-burn-worker`
//! (host/burn-worker) checks, charges and runs each operation. Native
//! programs (the tests) [`install`] a transport of their own.
//!
//! ```ignore
//! let device = burn::tensor::Device::new(burn_remote::host()).autodiff();
//! ```
//!
//! What crosses the boundary, and when:
//! - operations, tensor data the guest creates and seeds are [`wire::Command`]s,
//!   queued in guest memory and handed to the [`Transport`] in frames when
//!   the queue is full, when the guest reads a tensor, and on `sync`;
//! - only reads (and `sync`) wait for the host, so an error the host finds
//!   in a queued operation surfaces at the next read or sync, and every read
//!   after it (the session is spoiled: its tensors may be half-computed).
//!
//! Not covered: burn's graph capture (`fusion`), quantized tensors, and
//! moving tensors between this device and another (`to_device` to or from a
//! remote tensor panics, as with burn's own remote backend without a bridge).

mod client;
mod device;
#[cfg(feature = "guest")]
mod host;
mod names;
mod transport;
pub mod wire;

pub use client::{NoBridge, WtuneChannel, WtuneClient};
pub use device::RemoteDevice;
#[cfg(feature = "guest")]
pub use host::host;
pub use names::{
    ConnectError, Credential, CustomOpClient, Endpoint, EndpointAddr, EndpointId, HostSpec,
    InvalidRelays, IrohHost, IrohIdentity, IrohRelays, RelayUrl,
};
pub use transport::{Transport, install};

/// The backend burn's dispatch runs for [`RemoteDevice`]: burn-router's
/// operation recorder, sending to the wtune host.
pub type RemoteBackend = burn_router::BackendRouter<WtuneChannel>;
