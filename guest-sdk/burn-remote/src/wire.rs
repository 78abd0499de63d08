//! What a guest sends the host: [`Command`]s, packed into frames.
//!
//! A frame is commands one after another, each in postcard's encoding
//! (compact, with integer widths that do not depend on the platform, so a
//! wasm32 guest and a 64-bit host read it alike). The host runs a frame's
//! commands in order; [`Frame::push`] and [`commands`] are the two ends.

use burn_ir::{OperationIr, TensorId};
use burn_std::TensorData;
use serde::{Deserialize, Serialize};

/// One thing the guest asks of the host.
// Commands are encoded as soon as they are made and decoded one at a time,
// never kept in numbers: boxing the large variant would only add an
// allocation per operation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Run an operation. Its inputs are tensors the guest holds; its
    /// outputs get the fresh ids it names.
    Operation(OperationIr),
    /// A new tensor, `id`, holding values the guest made.
    Data { id: TensorId, data: TensorData },
    /// Seed the random operations that follow.
    Seed(u64),
}

/// Commands queued for the host, encoded.
#[derive(Debug, Default)]
pub struct Frame {
    bytes: Vec<u8>,
    commands: usize,
}

impl Frame {
    /// An empty frame.
    pub const fn new() -> Self {
        Self {
            bytes: Vec::new(),
            commands: 0,
        }
    }

    /// Appends `command`.
    pub fn push(&mut self, command: &Command) {
        self.bytes = postcard::to_extend(command, std::mem::take(&mut self.bytes))
            .expect("encoding into a Vec cannot fail");
        self.commands += 1;
    }

    /// How many commands are queued.
    pub fn len(&self) -> usize {
        self.commands
    }

    pub fn is_empty(&self) -> bool {
        self.commands == 0
    }

    /// The encoded commands, ready for [`commands`].
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Empties the frame, keeping its allocation.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.commands = 0;
    }
}

/// Decodes the commands of `frame` one at a time. A damaged frame yields
/// an error naming the command and byte where decoding stopped, and
/// nothing after it.
pub fn commands(frame: &[u8]) -> impl Iterator<Item = Result<Command, String>> + '_ {
    let mut rest = frame;
    let mut index = 0usize;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let at = frame.len() - rest.len();
        match postcard::take_from_bytes::<Command>(rest) {
            Ok((command, tail)) => {
                rest = tail;
                index += 1;
                Some(Ok(command))
            }
            Err(e) => {
                rest = &[];
                Some(Err(format!(
                    "command {index} of the frame (byte {at}) does not decode: {e}"
                )))
            }
        }
    })
}
