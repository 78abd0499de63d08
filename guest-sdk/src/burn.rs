//! The host's `wtune:trainable/burn` interface, as bytes: the transport of
//! burn models whose tensor operations the host runs.
//!
//! A trainable does not call these itself: with burn's `remote` feature
//! and wtune's `burn-remote` patched in (its `guest` feature on; see
//! `examples/digits-cnn`), `burn_remote::host()` is a burn device whose
//! operations are recorded as burn-ir, queued in guest memory and sent here
//! in frames. The host checks and charges every operation, then runs it
//! natively; the guest never sends code.
//!
//! What that means for the trainable:
//! - errors the host finds in queued operations (a shape it refuses, the
//!   trial's compute memory quota) surface at the next read of a tensor or
//!   `sync`, and every read after that fails the same way;
//! - a read (`into_scalar`, `into_data`) waits for the host, and between
//!   reads the guest records while the host computes: keep values such as
//!   a batch's loss on the device and read them once per epoch, not once
//!   per step (digits-cnn's `train_epoch`; it made the epoch 1.1-1.3x
//!   faster);
//! - the host's work is charged fuel as it runs, on the host compute scale;
//!   running out ends the trial as a guest instruction would;
//! - host snapshots carry the host's tensors of the trial, so checkpoints
//!   need no code, as for a model kept in the guest.

use crate::bindings::wtune::trainable::burn as host;

/// Queues a frame of burn-remote's wire commands to run after everything
/// queued before; returns before they run.
pub fn submit(frame: &[u8]) {
    host::submit(frame);
}

/// Runs `frame`, then returns the data of `tensor` (a postcard-encoded
/// burn-ir `TensorIr`) as a postcard-encoded `TensorData`, or the trial's
/// first burn error.
pub fn read(frame: &[u8], tensor: &[u8]) -> Result<Vec<u8>, String> {
    host::read(frame, tensor)
}

/// Runs `frame` and waits until everything queued so far has run, or
/// returns the trial's first burn error.
pub fn sync(frame: &[u8]) -> Result<(), String> {
    host::sync(frame)
}
