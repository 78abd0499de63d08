//! What `wtune` and its GPU worker say to each other over the worker's
//! stdin and stdout. Jobs that return nothing to the guest (creating,
//! writing and freeing buffers, built-in kernels) get no reply: the host
//! has checked them, so it streams them without waiting
//! ([`Request::replies`]). Every other request gets exactly one reply, in
//! order, after everything sent before it has run.
//!
//! A frame is a 4-byte little-endian header length, an 8-byte little-endian
//! payload length, the header as JSON and the payload as raw bytes. Buffer
//! contents travel in the payload as little-endian `f32`s, so tensors are
//! never turned into text; everything else is small and stays readable.

use std::io::{self, Read, Write};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::compute::ComputeError;
use crate::compute::device::{Kernel, PipelineInfo};

/// Largest header a peer may send: requests carry WGSL source, which the
/// session caps well below this.
const MAX_HEADER: u32 = 16 << 20;

/// Largest payload: one buffer.
const MAX_PAYLOAD: u64 = crate::compute::device::MAX_BUFFER_BYTES;

/// The worker's first frame: the adapter it opened, or why it has none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Hello {
    /// A Vulkan adapter and device are ready.
    Ready(Adapter),
    /// No usable adapter; the reason is for the user.
    NoAdapter(String),
}

/// The adapter a worker opened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Adapter {
    /// The adapter's name, such as `"NVIDIA H100 80GB HBM3"`.
    pub name: String,
    /// wgpu's device type: `"DiscreteGpu"`, `"Cpu"` (software), ...
    pub device_type: String,
    /// The driver and its version.
    pub driver: String,
    /// Whether this is a software rasterizer (lavapipe, SwiftShader).
    pub software: bool,
    /// Largest buffer the built-in kernels can bind whole, on every
    /// adapter host compute uses: a job one GPU takes, all take.
    pub max_buffer_bytes: u64,
    /// Most workgroups per dispatch dimension, on every adapter.
    pub max_workgroups: u32,
    /// Every adapter host compute uses, as [`described`], numbered as the
    /// experiment's pool numbers its GPUs (see `LocalGpu::open_nth`).
    pub all: Vec<String>,
    /// The PCI address of each of `all`, as the driver reports it
    /// (`0000:19:00.0`; empty where it reports none, as lavapipe).
    #[serde(default)]
    pub pci_buses: Vec<String>,
}

/// An adapter as the guest's `info()` names it: `"NVIDIA H100 80GB HBM3
/// (Vulkan, NVIDIA 570.86)"`.
pub fn described(name: &str, driver: &str) -> String {
    format!("{name} (Vulkan, {driver})")
}

/// A job for the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// A new buffer of `elements` zeros, or holding the payload.
    Create {
        id: u32,
        elements: u64,
        from_payload: bool,
    },
    /// The payload overwrites elements from `offset` on.
    Write { id: u32, offset: u64 },
    /// Reply with `len` elements from `offset`.
    Read { id: u32, offset: u64, len: u64 },
    /// Release a buffer.
    Free { id: u32 },
    /// Run a checked kernel.
    Run(Kernel),
    /// Compile WGSL into a pipeline.
    CreatePipeline {
        id: u32,
        wgsl: String,
        entry_point: String,
    },
    /// Run a pipeline and wait for it to finish.
    Dispatch {
        id: u32,
        bindings: Vec<u32>,
        groups: [u32; 3],
    },
    /// Release a pipeline.
    FreePipeline { id: u32 },
    /// Release everything: the worker goes back to the pool for another
    /// trial.
    Reset,
    /// Reply once every job sent so far has finished on the GPU.
    Sync,
}

impl Request {
    /// The job in words, for the reason a trial fails when it overruns.
    pub fn describe(&self) -> String {
        match self {
            Request::Create { id, .. } => format!("creating buffer {id}"),
            Request::Write { id, .. } => format!("a write to buffer {id}"),
            Request::Read { id, .. } => format!("a read of buffer {id}"),
            Request::Free { id } => format!("freeing buffer {id}"),
            Request::Run(kernel) => format!("a {} kernel", kernel.name()),
            Request::CreatePipeline { id, .. } => format!("compiling pipeline {id}"),
            Request::Dispatch { id, groups, .. } => format!(
                "a dispatch of pipeline {id} over {}x{}x{} workgroups",
                groups[0], groups[1], groups[2]
            ),
            Request::FreePipeline { id } => format!("freeing pipeline {id}"),
            Request::Reset => "clearing the worker".into(),
            Request::Sync => "finishing the queued GPU work".into(),
        }
    }

    /// Whether the worker answers this request. Those it does not answer
    /// are queued and sent in batches; a failure only the device can find
    /// in one of them (its memory ran out, it was lost) comes back as
    /// [`Reply::Lost`] to the next request that is answered.
    pub fn replies(&self) -> bool {
        !matches!(
            self,
            Request::Create { .. } | Request::Write { .. } | Request::Free { .. } | Request::Run(_)
        )
    }
}

/// Whether a request header the worker could not decode is of a kind that
/// gets a reply (see [`Request::replies`]), judged by its variant's name;
/// a header that is not even JSON is taken to want one.
pub fn tag_replies(header: &[u8]) -> bool {
    let tag = match serde_json::from_slice::<serde_json::Value>(header) {
        Ok(serde_json::Value::String(tag)) => tag,
        Ok(serde_json::Value::Object(map)) if map.len() == 1 => map
            .into_iter()
            .next()
            .map(|(tag, _)| tag)
            .unwrap_or_default(),
        _ => return true,
    };
    !matches!(tag.as_str(), "Create" | "Write" | "Free" | "Run")
}

/// The worker's answer to one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// Done; for `Read`, the payload holds the elements.
    Done,
    /// The pipeline compiled.
    Pipeline(PipelineInfo),
    /// The device refused or failed; nothing else changed.
    Failed(ComputeError),
    /// A job that gets no reply failed (named in the message), so the
    /// trial's device state is not what its calls made it; the worker ran
    /// nothing after it.
    Lost(String),
}

/// Writes one frame and flushes it.
pub fn write_frame<T: Serialize>(
    out: &mut impl Write,
    header: &T,
    payload: &[u8],
) -> io::Result<()> {
    out.write_all(&frame_head(header, payload.len())?)?;
    out.write_all(payload)?;
    out.flush()
}

/// Appends one frame to `batch`, for a writer elsewhere to send.
pub fn append_frame<T: Serialize>(
    batch: &mut Vec<u8>,
    header: &T,
    payload: &[u8],
) -> io::Result<()> {
    batch.extend_from_slice(&frame_head(header, payload.len())?);
    batch.extend_from_slice(payload);
    Ok(())
}

/// A frame's lengths and header, checked against the limits.
fn frame_head<T: Serialize>(header: &T, payload: usize) -> io::Result<Vec<u8>> {
    let header = serde_json::to_vec(header).map_err(io::Error::other)?;
    if header.len() as u64 > MAX_HEADER as u64 || payload as u64 > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a frame of {} + {payload} bytes is larger than allowed",
                header.len()
            ),
        ));
    }
    let mut head = Vec::with_capacity(12 + header.len());
    head.extend_from_slice(&(header.len() as u32).to_le_bytes());
    head.extend_from_slice(&(payload as u64).to_le_bytes());
    head.extend_from_slice(&header);
    Ok(head)
}

/// Reads one frame; `Ok(None)` at a clean end of the stream.
pub fn read_frame<T: DeserializeOwned>(input: &mut impl Read) -> io::Result<Option<(T, Vec<u8>)>> {
    match read_raw_frame(input)? {
        None => Ok(None),
        Some((header, payload)) => {
            let header = serde_json::from_slice(&header)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            Ok(Some((header, payload)))
        }
    }
}

/// Reads one frame without decoding its header, so a reader can answer a
/// header it does not understand and stay in step.
pub fn read_raw_frame(input: &mut impl Read) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut lengths = [0u8; 12];
    match input.read_exact(&mut lengths[..1]) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    input.read_exact(&mut lengths[1..])?;
    let header_len = u32::from_le_bytes(lengths[..4].try_into().expect("4 bytes"));
    let payload_len = u64::from_le_bytes(lengths[4..].try_into().expect("8 bytes"));
    if header_len > MAX_HEADER || payload_len > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {header_len} + {payload_len} bytes is larger than allowed"),
        ));
    }
    let mut header = vec![0; header_len as usize];
    input.read_exact(&mut header)?;
    let mut payload = vec![0; payload_len as usize];
    input.read_exact(&mut payload)?;
    Ok(Some((header, payload)))
}

/// `f32`s as the payload's little-endian bytes.
pub fn f32_bytes(data: &[f32]) -> &[u8] {
    bytemuck::cast_slice(data)
}

/// A payload's little-endian bytes as `f32`s.
pub fn bytes_f32(bytes: &[u8]) -> Result<Vec<f32>, ComputeError> {
    if !bytes.len().is_multiple_of(4) {
        return Err(ComputeError::Device(format!(
            "the GPU worker sent {} bytes, not a whole number of f32s",
            bytes.len()
        )));
    }
    Ok(bytemuck::pod_collect_to_vec(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::ops::Unary;

    #[test]
    fn an_undecodable_request_is_answered_only_if_its_kind_is() {
        // Variants this worker knows, with fields it does not.
        assert!(!tag_replies(br#"{"Run":{"Unknown":{"x":1}}}"#));
        assert!(!tag_replies(br#"{"Create":{"id":"seven"}}"#));
        assert!(tag_replies(br#"{"Read":{"id":1}}"#));
        assert!(tag_replies(br#""Sync""#));
        // Unknown kinds and non-JSON get an answer, as before streaming.
        assert!(tag_replies(br#""Frobnicate""#));
        assert!(tag_replies(b"\x00not json"));
        // Every kind the host streams is one the tag names as streamed.
        let streamed = [
            Request::Create {
                id: 1,
                elements: 4,
                from_payload: false,
            },
            Request::Write { id: 1, offset: 0 },
            Request::Free { id: 1 },
            Request::Run(Kernel::Unary {
                op: Unary::Neg,
                x: 1,
                out: 1,
                n: 4,
            }),
        ];
        for request in streamed {
            assert!(!request.replies());
            assert!(!tag_replies(&serde_json::to_vec(&request).unwrap()));
        }
    }

    #[test]
    fn frames_round_trip_and_a_clean_end_is_none() {
        let mut wire = Vec::new();
        let request = Request::Run(Kernel::Unary {
            op: Unary::Exp,
            x: 1,
            out: 2,
            n: 3,
        });
        write_frame(&mut wire, &request, f32_bytes(&[1.0, -2.5])).unwrap();
        write_frame(&mut wire, &Request::Reset, &[]).unwrap();
        let mut input = wire.as_slice();
        let (first, payload): (Request, _) = read_frame(&mut input).unwrap().unwrap();
        assert_eq!(first, request);
        assert_eq!(bytes_f32(&payload).unwrap(), [1.0, -2.5]);
        let (second, _): (Request, _) = read_frame(&mut input).unwrap().unwrap();
        assert_eq!(second, Request::Reset);
        assert!(read_frame::<Request>(&mut input).unwrap().is_none());
    }

    #[test]
    fn non_finite_scalars_cross_intact() {
        let mut wire = Vec::new();
        let request = Request::Run(Kernel::Axpy {
            alpha: f32::NAN,
            x: 1,
            y: 2,
            n: 3,
        });
        write_frame(&mut wire, &request, &[]).unwrap();
        let (back, _): (Request, _) = read_frame(&mut wire.as_slice()).unwrap().unwrap();
        match back {
            Request::Run(Kernel::Axpy { alpha, .. }) => assert!(alpha.is_nan()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn truncated_and_oversized_frames_are_errors() {
        let mut wire = Vec::new();
        write_frame(&mut wire, &Reply::Done, &[0; 8]).unwrap();
        let cut = &wire[..wire.len() - 3];
        assert!(read_frame::<Reply>(&mut &cut[..]).is_err());
        let mut huge = Vec::new();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&0u64.to_le_bytes());
        let err = read_frame::<Reply>(&mut huge.as_slice()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(bytes_f32(&[0; 5]).is_err());
    }
}
