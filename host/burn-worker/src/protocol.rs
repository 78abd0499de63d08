//! What wtune and a `wtune-burn-worker` say to each other over the
//! worker's stdin and stdout.
//!
//! wtune forwards the guest's frames and tensor descriptions as the guest
//! encoded them, and hands the guest the replies' payloads as they are: it
//! never decodes burn's types, so it needs no burn to build. Requests and
//! replies are a fixed little-endian header and raw bytes:
//!
//! - request: kind (u8: 0 submit, 1 read, 2 sync, 3 snapshot, 4 restore),
//!   fuel (u64), frame length (u64), tensor length (u64), the frame (a
//!   restore's: the snapshot's image), the tensor;
//! - reply, to all but submits, in order: status (u8: 0 ok, 1 error,
//!   2 error: the trial ran out of fuel), fuel spent since the last reply (u64), bytes held (u64), tensors held
//!   (u64), payload length (u64), the payload.
//!
//! `fuel` is what the trial has left as wtune counted it at the last reply;
//! a read's tensor is a postcard-encoded burn-ir `TensorIr`, and its reply's
//! payload a postcard-encoded `TensorData`; a snapshot's payload is the
//! session's image ([`Session::image`]), opaque to wtune, which hands it
//! back in a restore; an error's payload is its reason, as text. wtune's side of this is `wtune::burn::protocol`; the
//! two are tested together by wtune's tests, which run this worker.

use std::io::{self, Read, Write};

use crate::storage::Buffers;

use crate::{Session, Usage};

/// What the host asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Run the frame; no reply.
    Submit = 0,
    /// Run the frame, then reply with a tensor's data.
    Read = 1,
    /// Run the frame, then reply once it has run.
    Sync = 2,
    /// Reply with the session's image, for a host snapshot.
    Snapshot = 3,
    /// Take over the image in the frame; the session must be fresh.
    Restore = 4,
}

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub kind: Kind,
    pub fuel: u64,
    pub frame: Vec<u8>,
    pub tensor: Vec<u8>,
}

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The tensor's data (a read) or nothing (a sync); else why not.
    pub outcome: Result<Vec<u8>, String>,
    /// Whether the error is the trial running out of fuel.
    pub out_of_fuel: bool,
    pub fuel_spent: u64,
    pub usage: Usage,
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

fn bad(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// Reads `len` bytes, refusing lengths that cannot be a tensor.
fn read_bytes(input: &mut impl Read, len: u64) -> io::Result<Vec<u8>> {
    let len = usize::try_from(len).map_err(|_| bad(format!("a length of {len} bytes")))?;
    let mut bytes = Vec::new();
    input.take(len as u64).read_to_end(&mut bytes)?;
    if bytes.len() != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(bytes)
}

impl Request {
    /// Reads the next request; `None` once wtune has closed the pipe.
    pub fn read(input: &mut impl Read) -> io::Result<Option<Self>> {
        let mut header = [0u8; 25];
        match input.read_exact(&mut header[..1]) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            other => other?,
        }
        input.read_exact(&mut header[1..])?;
        let kind = match header[0] {
            0 => Kind::Submit,
            1 => Kind::Read,
            2 => Kind::Sync,
            3 => Kind::Snapshot,
            4 => Kind::Restore,
            other => return Err(bad(format!("request kind {other}"))),
        };
        let frame = read_bytes(input, u64_at(&header, 9))?;
        let tensor = read_bytes(input, u64_at(&header, 17))?;
        Ok(Some(Self {
            kind,
            fuel: u64_at(&header, 1),
            frame,
            tensor,
        }))
    }

    /// Writes the request.
    pub fn write(&self, output: &mut impl Write) -> io::Result<()> {
        output.write_all(&[self.kind as u8])?;
        output.write_all(&self.fuel.to_le_bytes())?;
        output.write_all(&(self.frame.len() as u64).to_le_bytes())?;
        output.write_all(&(self.tensor.len() as u64).to_le_bytes())?;
        output.write_all(&self.frame)?;
        output.write_all(&self.tensor)
    }
}

impl Reply {
    /// Reads a reply.
    pub fn read(input: &mut impl Read) -> io::Result<Self> {
        let mut header = [0u8; 33];
        input.read_exact(&mut header)?;
        let payload = read_bytes(input, u64_at(&header, 25))?;
        let outcome = match header[0] {
            0 => Ok(payload),
            1 | 2 => Err(String::from_utf8_lossy(&payload).into_owned()),
            other => return Err(bad(format!("reply status {other}"))),
        };
        Ok(Self {
            outcome,
            out_of_fuel: header[0] == 2,
            fuel_spent: u64_at(&header, 1),
            usage: Usage {
                bytes: u64_at(&header, 9),
                tensors: u64_at(&header, 17),
            },
        })
    }

    /// Writes the reply.
    pub fn write(&self, output: &mut impl Write) -> io::Result<()> {
        let (status, payload) = match &self.outcome {
            Ok(data) => (0u8, data.as_slice()),
            Err(why) if self.out_of_fuel => (2u8, why.as_bytes()),
            Err(why) => (1u8, why.as_bytes()),
        };
        output.write_all(&[status])?;
        output.write_all(&self.fuel_spent.to_le_bytes())?;
        output.write_all(&self.usage.bytes.to_le_bytes())?;
        output.write_all(&self.usage.tensors.to_le_bytes())?;
        output.write_all(&(payload.len() as u64).to_le_bytes())?;
        output.write_all(payload)
    }
}

/// Serves `session` until wtune closes `input`.
pub fn serve<B: Buffers>(
    session: &mut Session<B>,
    input: &mut impl Read,
    output: &mut impl Write,
) -> io::Result<()> {
    while let Some(request) = Request::read(input)? {
        session.grant(request.fuel);
        let outcome = match request.kind {
            Kind::Submit => {
                session.run(&request.frame);
                continue;
            }
            Kind::Read => {
                session.run(&request.frame);
                match postcard::from_bytes(&request.tensor) {
                    Ok(tensor) => session.read(&[], tensor).map(|data| {
                        postcard::to_allocvec(&data).expect("encoding into a Vec cannot fail")
                    }),
                    Err(e) => {
                        Err(session.refuse(format!("the tensor to read does not decode: {e}")))
                    }
                }
            }
            Kind::Sync => session.sync(&request.frame).map(|()| Vec::new()),
            Kind::Snapshot => session.image(),
            Kind::Restore => session.restore(&request.frame).map(|()| Vec::new()),
        };
        let reply = Reply {
            out_of_fuel: outcome.is_err() && session.out_of_fuel(),
            outcome,
            fuel_spent: session.take_fuel_spent(),
            usage: session.usage(),
        };
        reply.write(output)?;
        output.flush()?;
    }
    Ok(())
}
