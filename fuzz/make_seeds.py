#!/usr/bin/env python3
"""Writes the hand-built snapshot seeds in seeds/snapshot/ (needs the zstd CLI).

Each seed is one mode byte (see fuzz_targets/snapshot.rs: 0x01 = the target
appends the right trailer, 0x03 = the same with a snapshot key) and a snapshot
file without its 32-byte trailer, laid out as host/src/snapshot/format.rs
describes: magic, version, flags, header length and JSON header, payload
length and zstd frames (each behind its u64 length).
"""
import json
import os
import struct
import subprocess
import tempfile

COMPONENT = "ab" * 32
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "seeds", "snapshot")


def zstd(data):
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
    try:
        return subprocess.run(["zstd", "-1", "-q", "-c", f.name], check=True,
                              stdout=subprocess.PIPE).stdout
    finally:
        os.unlink(f.name)


def body(version, flags, header, frames):
    header = json.dumps(header, separators=(",", ":")).encode()
    payload = b"".join(struct.pack("<Q", len(f)) + f for f in map(zstd, frames))
    return (b"WTSNAP\r\n" + struct.pack("<III", version, flags, len(header)) + header
            + struct.pack("<Q", len(payload)) + payload)


META = {
    "component": COMPONENT,
    "trial_id": "trial_0000",
    "config": {"lr": 0.1, "width": 16},
    "iteration": 3,
    "fuel_total": 123456,
    "time_total_s": 1.5,
    "result": {"loss": 0.25, "training_iteration": 3},
}


def write(name, mode, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(bytes([mode]) + data)


def main():
    os.makedirs(OUT, exist_ok=True)
    # Host snapshot, version 1: two memories (one empty), globals.
    mem = bytes(range(256)) * 16 + b"\x07" * 4096
    write("memory-v1.bin", 0x01, body(1, 0, dict(
        META,
        memories=[{"pages": 1, "runs": [[0, 4096], [8192, 4096]]},
                  {"pages": 2, "runs": []}],
        globals=[{"i32": -5}, {"i64": 1 << 40}, {"f32": 1065353216},
                 {"f64": 9221120237041090563}],
        data_len=len(mem),
    ), [mem, b""]))
    # Host snapshot, version 2: a memory and host compute buffers.
    small = b"\x01" * 4096
    b2 = struct.pack("<4f", 1.5, -0.0, 2.0, 3.0)
    b7 = struct.pack("<2f", float("nan"), 1e-40)
    write("compute-v2.bin", 0x01, body(2, 0, dict(
        META,
        memories=[{"pages": 1, "runs": [[4096, 4096]]}],
        globals=[],
        data_len=len(small),
        compute={"next_buffer": 9, "buffers": [[2, 4], [7, 2]]},
    ), [small, b2, b7]))
    # The guest's own save() bytes, unkeyed and keyed.
    state = b"model weights " * 20
    guest = dict(META, memories=[], globals=[], data_len=len(state))
    write("guest.bin", 0x01, body(1, 2, guest, [state]))
    write("guest-keyed.bin", 0x03, body(1, 3, guest, [state]))


if __name__ == "__main__":
    main()
