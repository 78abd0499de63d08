//! The link from a guest's burn client to the host that runs its tensors.

use std::sync::OnceLock;

use burn_ir::TensorIr;
use burn_std::{BoolStore, ExecutionError, TensorData};

/// How queued commands reach the host. In a wtune guest this is the host's
/// burn interface; a native program (a test, a benchmark) installs its own
/// with [`install`].
///
/// The host keeps the first error it meets: it answers the read or sync
/// that follows with it, and every one after.
pub trait Transport: Send + Sync + 'static {
    /// Hands over a frame of encoded commands ([`crate::wire`]) to run in
    /// order. Returns before they run; the host may be busy with them when
    /// the next frame arrives.
    fn submit(&self, frame: &[u8]);

    /// Runs `frame` and then reads `tensor` back.
    fn read(&self, frame: &[u8], tensor: TensorIr) -> Result<TensorData, ExecutionError>;

    /// Runs `frame` and waits until every command sent so far has run.
    fn sync(&self, frame: &[u8]) -> Result<(), ExecutionError>;

    /// How the host's backend stores bool tensors, which the client's
    /// tensors then use: native bytes on burn's CPU backend (the default),
    /// 32-bit words on a GPU, whose kernels have no narrower type.
    fn bools(&self) -> BoolStore {
        BoolStore::Native
    }
}

static TRANSPORT: OnceLock<Box<dyn Transport>> = OnceLock::new();

/// Sends this process's remote tensors through `transport`. The first
/// call wins: a transport cannot change under tensors it holds. Returns
/// false when one was already installed.
pub fn install(transport: impl Transport) -> bool {
    TRANSPORT.set(Box::new(transport)).is_ok()
}

/// How the installed transport's host stores bools ([`Transport::bools`]);
/// native bytes before one is installed.
pub(crate) fn bools() -> BoolStore {
    installed().map_or(BoolStore::Native, Transport::bools)
}

/// The installed transport, if any.
pub(crate) fn installed() -> Option<&'static dyn Transport> {
    TRANSPORT.get().map(|t| &**t)
}
