//! TensorBoard's event file format, written by hand because what wtune
//! writes is small: a file is a sequence of records (`u64` length, masked
//! CRC32C of the length, a protobuf `Event`, masked CRC32C of the event),
//! and wtune writes four kinds of event:
//! - the file version (`brain.Event:2`), first in every file;
//! - scalars: one `Summary` per result, a `simple_value` per numeric metric
//!   (as [`super::scalars::Scalars`] takes them), at the result's
//!   `training_iteration`;
//! - the HParams plugin's `session_start_info` (the trial's configuration)
//!   and `session_end_info` (its status), which TensorBoard's HParams tab
//!   reads to compare trials side by side.
//!
//! [`kept`] reads a file back to cut it to the iterations a continuing
//! trial keeps, so that no step is in a file twice after `wtune resume`.
//!
//! The messages follow tensorflow/core/util/event.proto,
//! tensorflow/core/framework/summary.proto and
//! tensorboard/plugins/hparams/plugin_data.proto; only the fields named
//! here are written. Tests read the files with TensorBoard's own reader
//! (tests/tensorboard.rs).

use std::path::Path;

use serde_json::Value;

/// Event files' names start with this; TensorBoard reads any file whose
/// name holds `tfevents`.
pub const FILE_PREFIX: &str = "events.out.tfevents.";
/// wtune's event files end with this, so a trial's directory tells which
/// event file is its own to append to and cut back.
pub const FILE_SUFFIX: &str = ".wtune";

/// The tag prefix of the HParams plugin's summaries.
const SESSION_START_TAG: &str = "_hparams_/session_start_info";
const SESSION_END_TAG: &str = "_hparams_/session_end_info";
const HPARAMS_PLUGIN: &str = "hparams";

/// How a trial ended, as the HParams plugin's `Status` enum says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionStatus {
    Success = 1,
    Failure = 2,
}

/// How to look at an experiment directory's curves in TensorBoard, when
/// some trial directory in it holds a wtune event file.
pub fn tensorboard_line(experiment_dir: &Path) -> Option<String> {
    let has_events = |dir: &Path| {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with(FILE_PREFIX) && name.ends_with(FILE_SUFFIX)
            })
        })
    };
    let any = std::fs::read_dir(experiment_dir)
        .ok()?
        .flatten()
        .any(|e| e.file_type().is_ok_and(|t| t.is_dir()) && has_events(&e.path()));
    any.then(|| {
        format!(
            "Curves and hyperparameters in TensorBoard: tensorboard --logdir {}",
            experiment_dir.display()
        )
    })
}

/// The name of a new event file, made at `unix_secs`.
pub fn file_name(unix_secs: u64) -> String {
    format!("{FILE_PREFIX}{unix_secs}{FILE_SUFFIX}")
}

/// Appends the file-version event every event file starts with.
pub fn file_version(out: &mut Vec<u8>, wall_time: f64) {
    let mut event = Vec::new();
    double(&mut event, 1, wall_time);
    bytes(&mut event, 3, b"brain.Event:2");
    record(out, &event);
}

/// Appends one event holding every scalar of `values` (tag, value) at
/// `step`; nothing when there are none. Written straight into `out`,
/// with no allocation: results arrive hundreds of thousands a second
/// (BENCHMARKS.md).
pub fn scalars(out: &mut Vec<u8>, values: &[(String, f64)], wall_time: f64, step: u64) {
    if values.is_empty() {
        return;
    }
    let value_len = |tag: &str| 1 + varint_len(tag.len() as u64) + tag.len() + 5;
    let summary_len: usize = values
        .iter()
        .map(|(tag, _)| {
            let n = value_len(tag);
            1 + varint_len(n as u64) + n
        })
        .sum();
    let event_len = 9 + 1 + varint_len(step) + 1 + varint_len(summary_len as u64) + summary_len;
    let start = begin_record(out, event_len);
    double(out, 1, wall_time);
    key(out, 2, VARINT);
    varint(out, step);
    key(out, 5, LEN);
    varint(out, summary_len as u64);
    for (tag, x) in values {
        key(out, 1, LEN);
        varint(out, value_len(tag) as u64);
        bytes(out, 1, tag.as_bytes());
        key(out, 2, FIXED32);
        // TensorBoard's `simple_value` is a float.
        out.extend_from_slice(&(*x as f32).to_le_bytes());
    }
    end_record(out, start);
}

/// Appends the HParams `session_start_info` for a trial starting with
/// `config`, at step 0. `group` names the session (the trial id).
/// TensorBoard keeps the first a file holds.
pub fn session_start(out: &mut Vec<u8>, wall_time: f64, group: &str, config: &Value) {
    let mut info = Vec::new();
    let mut path = String::new();
    if let Value::Object(map) = config {
        for (name, value) in map {
            path.clear();
            path.push_str(name);
            hparams(&mut info, &mut path, value);
        }
    }
    bytes(&mut info, 4, group.as_bytes());
    double(&mut info, 5, wall_time);
    hparams_event(out, wall_time, 0, SESSION_START_TAG, 3, &info);
}

/// Adds `value` to a `SessionStartInfo`'s `hparams` map under `path`,
/// nested tables flattened as `outer/inner` (the HParams tab has one column
/// per name); a list becomes its JSON text.
fn hparams(info: &mut Vec<u8>, path: &mut String, value: &Value) {
    if let Value::Object(map) = value {
        for (name, inner) in map {
            let len = path.len();
            path.push('/');
            path.push_str(name);
            hparams(info, path, inner);
            path.truncate(len);
        }
        return;
    }
    // google.protobuf.Value: null_value = 1, number_value = 2,
    // string_value = 3, bool_value = 4.
    let mut proto_value = Vec::new();
    match value {
        Value::Null => {
            key(&mut proto_value, 1, VARINT);
            varint(&mut proto_value, 0);
        }
        Value::Number(n) => double(&mut proto_value, 2, n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => bytes(&mut proto_value, 3, s.as_bytes()),
        Value::Bool(b) => {
            key(&mut proto_value, 4, VARINT);
            varint(&mut proto_value, u64::from(*b));
        }
        other => bytes(&mut proto_value, 3, other.to_string().as_bytes()),
    }
    let mut entry = Vec::new();
    bytes(&mut entry, 1, path.as_bytes());
    bytes(&mut entry, 2, &proto_value);
    bytes(info, 1, &entry);
}

/// Appends the HParams `session_end_info`: how the trial ended, at its
/// last iteration.
pub fn session_end(out: &mut Vec<u8>, wall_time: f64, step: u64, status: SessionStatus) {
    let mut info = Vec::new();
    key(&mut info, 1, VARINT);
    varint(&mut info, status as u64);
    double(&mut info, 2, wall_time);
    hparams_event(out, wall_time, step, SESSION_END_TAG, 4, &info);
}

/// An event whose summary holds one HParams plugin value: no data, the
/// `HParamsPluginData` (version 0, `info` as its field `field`) in the
/// value's metadata, as TensorBoard's own hparams summary writes it.
fn hparams_event(out: &mut Vec<u8>, wall_time: f64, step: u64, tag: &str, field: u32, info: &[u8]) {
    let mut plugin_data = Vec::new();
    bytes(&mut plugin_data, field, info);
    let mut plugin = Vec::new();
    bytes(&mut plugin, 1, HPARAMS_PLUGIN.as_bytes());
    bytes(&mut plugin, 2, &plugin_data);
    let mut metadata = Vec::new();
    bytes(&mut metadata, 1, &plugin);
    let mut value = Vec::new();
    bytes(&mut value, 1, tag.as_bytes());
    bytes(&mut value, 9, &metadata);
    let mut summary = Vec::new();
    bytes(&mut summary, 1, &value);
    let mut event = Vec::new();
    double(&mut event, 1, wall_time);
    key(&mut event, 2, VARINT);
    varint(&mut event, step);
    bytes(&mut event, 5, &summary);
    record(out, &event);
}

/// The records of an event file that a trial continuing after iteration
/// `after` keeps: the file version, its configuration and scalars at steps
/// up to `after`. Its end (`session_end_info`) goes: the trial has not ended.
/// Reading stops at the first record that is cut short or whose checksums
/// do not match (a process killed while writing).
pub fn kept(file: &[u8], after: u64) -> Vec<u8> {
    let mut kept = Vec::with_capacity(file.len());
    let mut rest = file;
    while let Some((event, whole)) = next_record(rest) {
        let (step, ends_session) = step_and_end(event);
        if step <= after && !ends_session {
            kept.extend_from_slice(&rest[..whole]);
        }
        rest = &rest[whole..];
    }
    kept
}

/// The event in the record at the start of `bytes`, and the record's whole
/// length; `None` if there is no whole, intact record there.
fn next_record(bytes: &[u8]) -> Option<(&[u8], usize)> {
    let header = bytes.get(..12)?;
    let len_bytes: [u8; 8] = header[..8].try_into().ok()?;
    let len_crc = u32::from_le_bytes(header[8..12].try_into().ok()?);
    if masked_crc(&len_bytes) != len_crc {
        return None;
    }
    let len = usize::try_from(u64::from_le_bytes(len_bytes)).ok()?;
    let end = 12usize.checked_add(len)?.checked_add(4)?;
    let event = bytes.get(12..12 + len)?;
    let crc = u32::from_le_bytes(bytes.get(12 + len..end)?.try_into().ok()?);
    (masked_crc(event) == crc).then_some((event, end))
}

/// Each whole record's step and whether it ends the session, and the bytes
/// after the last whole record.
#[cfg(test)]
pub(super) fn records(mut bytes: &[u8]) -> (Vec<(u64, bool)>, usize) {
    let mut steps = Vec::new();
    while let Some((event, whole)) = next_record(bytes) {
        steps.push(step_and_end(event));
        bytes = &bytes[whole..];
    }
    (steps, bytes.len())
}

/// An event's step, and whether it is a `session_end_info`.
fn step_and_end(event: &[u8]) -> (u64, bool) {
    let mut step = 0;
    let mut ends = false;
    for (field, value) in Fields(event) {
        match (field, value) {
            (2, Field::Varint(s)) => step = s,
            (5, Field::Bytes(summary)) => {
                for (field, value) in Fields(summary) {
                    if let (1, Field::Bytes(value)) = (field, value) {
                        ends |= Fields(value).any(|(f, v)| {
                            f == 1 && matches!(v, Field::Bytes(tag) if tag == SESSION_END_TAG.as_bytes())
                        });
                    }
                }
            }
            _ => {}
        }
    }
    (step, ends)
}

// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn double(out: &mut Vec<u8>, field: u32, x: f64) {
    key(out, field, FIXED64);
    out.extend_from_slice(&x.to_le_bytes());
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    key(out, field, LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// One field of a protobuf message, as [`Fields`] reads it.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// The fields of a protobuf message; stops at anything malformed.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.0.split_first()?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn skip(&mut self, n: usize) -> Option<&'a [u8]> {
        let taken = self.0.get(..n)?;
        self.0 = &self.0[n..];
        Some(taken)
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = (u64, Field<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        let k = self.varint()?;
        let value = match (k & 7) as u8 {
            VARINT => Field::Varint(self.varint()?),
            FIXED64 => self.skip(8).map(|_| Field::Fixed)?,
            LEN => {
                let n = usize::try_from(self.varint()?).ok()?;
                Field::Bytes(self.skip(n)?)
            }
            FIXED32 => self.skip(4).map(|_| Field::Fixed)?,
            _ => {
                self.0 = &[];
                return None;
            }
        };
        Some((k >> 3, value))
    }
}

/// Appends a record's length and its checksum; returns where the event
/// starts, for [`end_record`].
fn begin_record(out: &mut Vec<u8>, event_len: usize) -> usize {
    let len = (event_len as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.len()
}

/// Appends the checksum of the event written since `start`.
fn end_record(out: &mut Vec<u8>, start: usize) {
    let crc = masked_crc(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

fn record(out: &mut Vec<u8>, event: &[u8]) {
    let start = begin_record(out, event.len());
    out.extend_from_slice(event);
    end_record(out, start);
}

/// TensorFlow's masked CRC32C (a CRC of data that holds CRCs is weak, so
/// records store it rotated and offset).
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_masked_crc_is_tensorflows() {
        // CRC32C's check value, and TensorFlow's mask of it
        // (crc32c.py: ((crc >> 15) | (crc << 17)) + 0xa282ead8, worked out
        // by hand).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn varint_lengths_match_the_encoding() {
        for v in [0, 1, 127, 128, 16_383, 16_384, u32::MAX as u64, u64::MAX] {
            let mut out = Vec::new();
            varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
            assert_eq!(
                Fields(&[&[0x08][..], &out].concat())
                    .next()
                    .map(|(f, x)| (f, matches!(x, Field::Varint(y) if y == v))),
                Some((1, true))
            );
        }
    }

    /// Records of every kind, then `kept` at several cut points.
    #[test]
    fn cutting_back_keeps_whole_records_up_to_the_step() {
        let mut file = Vec::new();
        file_version(&mut file, 1.0);
        session_start(
            &mut file,
            1.0,
            "trial_0000",
            &json!({"lr": 0.1, "opt": {"m": 0.9}, "l": [1]}),
        );
        for step in 1..=3 {
            let values = [
                ("loss".to_string(), step as f64),
                ("config/lr".to_string(), 0.1),
            ];
            scalars(&mut file, &values, 2.0, step);
        }
        session_end(&mut file, 4.0, 3, SessionStatus::Success);
        let records = |bytes: &[u8]| {
            let (steps, rest) = records(bytes);
            assert_eq!(rest, 0, "bytes after the last record");
            steps
        };
        assert_eq!(
            records(&file),
            [
                (0, false),
                (0, false),
                (1, false),
                (2, false),
                (3, false),
                (3, true)
            ]
        );
        assert_eq!(records(&kept(&file, 0)), [(0, false), (0, false)]);
        assert_eq!(records(&kept(&file, 2)).len(), 4);
        assert_eq!(records(&kept(&file, 3)).len(), 5, "the end goes");
        // A record cut short, or with a flipped bit, ends what is kept.
        let whole = kept(&file, 9);
        for cut in [whole.len() - 1, whole.len() - 30] {
            assert_eq!(records(&kept(&whole[..cut], 9)).len(), 4);
        }
        let mut flipped = file.clone();
        let third = kept(&file, 1).len() - 3;
        flipped[third] ^= 1;
        assert_eq!(records(&kept(&flipped, 9)).len(), 2);
    }
}
