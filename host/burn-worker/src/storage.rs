//! Where a backend keeps a tensor's bytes, as the backend itself says.
//!
//! burn's backends make many operations views: a slice, a reshape or a
//! permutation shares its input's buffer instead of copying it, and which
//! ones do depends on the backend and on the input's layout (a reshape of
//! a permuted tensor copies). The [`Ledger`](crate::ledger::Ledger)
//! charges buffers, not tensors, so it asks the backend after each
//! operation which buffer each output holds: a list of the operations that
//! make views would be a guess that a hostile guest could find the gaps
//! in.

use burn_flex::Flex;
use burn_ir::{BackendIr, HandleKind};

use crate::gpu::Gpu;

/// A buffer a tensor keeps alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffer {
    /// Names the buffer among those alive: tensors with the same key share
    /// it. A key may be reused once no tensor holds its buffer.
    pub key: usize,
    /// Its size in bytes, whatever part of it the tensor shows.
    pub bytes: u64,
}

/// A burn backend whose tensors say which buffer they hold.
pub trait Buffers: BackendIr {
    /// The buffer `tensor` holds, if the backend says.
    fn buffer(tensor: &HandleKind<Self>) -> Option<Buffer>;
}

impl Buffers for Flex {
    fn buffer(tensor: &HandleKind<Self>) -> Option<Buffer> {
        let tensor = match tensor {
            HandleKind::Float(t) | HandleKind::Int(t) | HandleKind::Bool(t) => t,
            // The host holds no quantized tensors (`ledger::supported`).
            HandleKind::Quantized(_) => return None,
        };
        // burn-flex keeps a tensor's bytes in an `Arc`, shared by its views:
        // its address names the buffer for as long as a tensor holds it.
        let data = tensor.data_arc();
        Some(Buffer {
            key: std::sync::Arc::as_ptr(&data) as usize,
            bytes: data.len() as u64,
        })
    }
}

impl Buffers for Gpu {
    fn buffer(tensor: &HandleKind<Self>) -> Option<Buffer> {
        let tensor = match tensor {
            HandleKind::Float(t) | HandleKind::Int(t) | HandleKind::Bool(t) => t,
            HandleKind::Quantized(_) => return None,
        };
        // cubecl names each allocation with an id it never reuses; a view's
        // handle is its input's, with offsets.
        let handle = &tensor.handle;
        Some(Buffer {
            key: handle.memory.descriptor().id.value,
            bytes: handle.size(),
        })
    }
}
