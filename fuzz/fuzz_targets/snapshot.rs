//! The snapshot (checkpoint) file decoder, `wtune::snapshot::decode`.
//!
//! The first byte of an input picks the mode, the rest is the file:
//! - bit 0 clear: the rest is a whole file, decoded as it is, so the
//!   checks before and around the trailer (magic, version, lengths,
//!   checksum, MAC) are fuzzed;
//! - bit 0 set: the rest is a file without its 32-byte trailer, and the
//!   target appends the right one (blake3, or the keyed MAC when the file's
//!   keyed flag is set), as anyone who can write a checkpoint file can for
//!   the plain checksum, so the parsing behind the checksum is fuzzed;
//! - bit 1: decode with a snapshot key (a MAC is then required).
//!
//! Files must belong to [`COMPONENT`] to get past the header; the seeds use
//! it.
//!
//! Invariants checked: a file with a correct trailer is never refused for
//! its checksum or MAC; a decoded snapshot encodes to a file that decodes
//! again, and encoding that gives the same bytes.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use wtune::snapshot::{FormatError, SnapshotKey, decode, encode};

/// The component digest every seed names.
const COMPONENT: &str = "abababababababababababababababababababababababababababababababab";
/// Offset of the flags word: magic (8), version (4).
const FLAGS_AT: usize = 12;
const FLAG_KEYED: u32 = 1;

fn key() -> &'static SnapshotKey {
    static KEY: OnceLock<SnapshotKey> = OnceLock::new();
    KEY.get_or_init(|| SnapshotKey::derive(b"wtune fuzz key"))
}

/// The raw key bytes behind [`key`], for computing MACs here.
fn key_bytes() -> [u8; 32] {
    blake3::derive_key("wtune snapshot key v1", b"wtune fuzz key")
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let fix_trailer = mode & 1 != 0;
    let key = (mode & 2 != 0).then(key);

    let file = if fix_trailer {
        let keyed = rest
            .get(FLAGS_AT..FLAGS_AT + 4)
            .is_some_and(|f| u32::from_le_bytes(f.try_into().unwrap()) & FLAG_KEYED != 0);
        let trailer = if keyed {
            blake3::keyed_hash(&key_bytes(), rest)
        } else {
            blake3::hash(rest)
        };
        let mut file = rest.to_vec();
        file.extend_from_slice(trailer.as_bytes());
        file
    } else {
        rest.to_vec()
    };

    match decode(&file, COMPONENT, key) {
        Ok((meta, payload)) => {
            let first = encode(&meta, &payload, key);
            let (meta2, payload2) = decode(&first, COMPONENT, key)
                .unwrap_or_else(|e| panic!("a re-encoded snapshot is refused: {e}"));
            let second = encode(&meta2, &payload2, key);
            assert!(first == second, "encoding is not stable across a decode");
        }
        Err(FormatError::Checksum | FormatError::Authentication) if fix_trailer => {
            // Only a file too short to carry its header before the trailer
            // can fail so: the trailer is then read from other bytes.
            assert!(
                rest.len() < FLAGS_AT + 4,
                "a file with a correct trailer was refused for it"
            );
        }
        Err(err) => {
            let _ = err.to_string();
        }
    }
});
