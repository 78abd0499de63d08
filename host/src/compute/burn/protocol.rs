//! wtune's side of what it and a `wtune-burn-worker` say over the worker's
//! pipes. The worker's `protocol.rs` (host/burn-worker) defines the format;
//! this mirrors it without burn's types: the guest's frames and tensor
//! descriptions go over as the guest encoded them, and a read's data comes
//! back for the guest to decode.
//!
//! - request: kind (u8: 0 submit, 1 read, 2 sync, 3 snapshot, 4 restore),
//!   fuel (u64), frame length (u64), tensor length (u64), the frame (a
//!   restore's: the snapshot's image), the tensor;
//! - reply, to all but submits, in order: status (u8: 0 ok, 1 error,
//!   2 error: the trial ran out of fuel), fuel spent since the last reply (u64), bytes held (u64), tensors held
//!   (u64), payload length (u64), the payload.
//!
//! All integers are little-endian.

use std::io::{self, Read};

/// What wtune asks of the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Run the frame; no reply.
    Submit = 0,
    /// Run the frame, then reply with a tensor's data.
    Read = 1,
    /// Run the frame, then reply once it has run.
    Sync = 2,
    /// Reply with the trial's burn session as bytes, for a host snapshot.
    Snapshot = 3,
    /// Take over a snapshot's burn session (the frame); the worker must be
    /// fresh.
    Restore = 4,
}

/// A request, encoded. `fuel` is what the trial has left, as wtune counted
/// it at the worker's last reply.
pub fn request(kind: Kind, fuel: u64, frame: &[u8], tensor: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(25 + frame.len() + tensor.len());
    bytes.push(kind as u8);
    bytes.extend_from_slice(&fuel.to_le_bytes());
    bytes.extend_from_slice(&(frame.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&(tensor.len() as u64).to_le_bytes());
    bytes.extend_from_slice(frame);
    bytes.extend_from_slice(tensor);
    bytes
}

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// A read's data (a sync's is empty), or why the trial's burn session
    /// failed: the first command it refused or that failed.
    pub outcome: Result<Vec<u8>, String>,
    /// Whether the error is a command the trial's fuel could not pay for.
    pub out_of_fuel: bool,
    /// Fuel the worker spent since its last reply.
    pub fuel_spent: u64,
    /// Bytes the trial's tensors take.
    pub bytes: u64,
    /// How many tensors the trial holds.
    pub tensors: u64,
}

/// What a payload may take beyond the trial's quota: the encoding of its
/// tensors (shapes, types; at most `MAX_TENSORS` of them) and a snapshot's
/// record of random draws.
pub const PAYLOAD_OVERHEAD: u64 = 64 << 20;

/// Reads the next reply, refusing a payload over `max_payload` bytes (a
/// tensor's data, or a snapshot of all of them, which the trial's quota
/// bounds); `None` when the worker closed its output first.
pub fn read_reply(input: &mut impl Read, max_payload: u64) -> io::Result<Option<Reply>> {
    let mut header = [0u8; 33];
    match input.read_exact(&mut header[..1]) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    input.read_exact(&mut header[1..])?;
    let at = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().expect("8 bytes"));
    let len = at(25);
    if len > max_payload {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a reply of {len} bytes"),
        ));
    }
    let mut payload = Vec::new();
    input.take(len).read_to_end(&mut payload)?;
    if payload.len() as u64 != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let outcome = match header[0] {
        0 => Ok(payload),
        1 | 2 => Err(String::from_utf8_lossy(&payload).into_owned()),
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("reply status {other}"),
            ));
        }
    };
    Ok(Some(Reply {
        outcome,
        out_of_fuel: header[0] == 2,
        fuel_spent: at(1),
        bytes: at(9),
        tensors: at(17),
    }))
}
