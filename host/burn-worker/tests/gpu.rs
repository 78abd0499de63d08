//! The worker on a GPU (the first adapter Vulkan lists: lavapipe where
//! there is no hardware one): its sessions check, run and snapshot as on
//! the CPU; bools stored as the CPU stores them are refused by name; the
//! executable confines itself around the driver and names a GPU it cannot
//! find with those it can.
//!
//! The GPU's random generator is global to the process (cubecl's), so
//! these tests take turns.

mod common;

use std::process::Command as Process;
use std::sync::{Mutex, OnceLock};

use burn_ir::{BinaryOpIr, NumericOperationIr, OperationIr, TensorId, TensorStatus};
use burn_remote::wire::Command;
use burn_std::{BoolStore, DType, Distribution, TensorData};
use common::{data, frame, random, tensor, values};
use wtune_burn_worker::Session;
use wtune_burn_worker::gpu::{self, Adapter, Gpu};

const WORKER: &str = env!("CARGO_BIN_EXE_wtune-burn-worker");

static SERIAL: Mutex<()> = Mutex::new(());

/// The first GPU here, as the host names it to the worker.
fn adapter() -> Adapter {
    gpu::adapters()
        .into_iter()
        .next()
        .expect("a Vulkan adapter: install mesa-vulkan-drivers for software Vulkan")
}

/// A fresh session on the first GPU; the device is opened once.
fn session() -> Session<Gpu> {
    static DEVICE: OnceLock<gpu::Device> = OnceLock::new();
    let device = DEVICE.get_or_init(|| gpu::open(&adapter()).expect("the GPU opens"));
    Session::on(device.clone(), 1 << 20, u64::MAX)
}

const DRAW: Distribution = Distribution::Uniform(0.0, 1.0);

fn add(lhs: u64, rhs: u64, out: u64, n: usize) -> Command {
    Command::Operation(OperationIr::NumericFloat(
        DType::F32,
        NumericOperationIr::Add(BinaryOpIr {
            lhs: tensor(lhs, &[n], TensorStatus::ReadOnly),
            rhs: tensor(rhs, &[n], TensorStatus::ReadOnly),
            out: tensor(out, &[n], TensorStatus::NotInit),
        }),
    ))
}

#[test]
fn a_gpu_session_computes_and_its_snapshot_continues_drawing_where_it_stood() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut original = session();
    original.run(&frame([
        data(1, vec![1.0, 2.0, 3.0]),
        add(1, 1, 2, 3),
        Command::Seed(5),
        random(3, 64, DRAW),
    ]));
    assert_eq!(values(&mut original, 2, 3), [2.0, 4.0, 6.0]);
    let image = original.image().expect("an image");
    original.run(&frame([random(4, 64, DRAW)]));
    let next = values(&mut original, 4, 64);
    assert!(next.iter().all(|v| (0.0..1.0).contains(v)), "{next:?}");

    let mut restored = session();
    restored.restore(&image).expect("the image restores");
    assert_eq!(values(&mut restored, 2, 3), [2.0, 4.0, 6.0]);
    assert_eq!(values(&mut restored, 3, 64), values(&mut original, 3, 64));
    restored.run(&frame([random(4, 64, DRAW)]));
    assert_eq!(values(&mut restored, 4, 64), next);
}

#[test]
fn a_gpu_session_refuses_bools_stored_as_bytes_by_name() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut session = session();
    session.run(&frame([Command::Data {
        id: TensorId::new(1),
        data: TensorData::new(vec![true, false], [2]),
    }]));
    let error = session.error().expect("refused").to_owned();
    assert!(
        error.contains(&format!(
            "has no {:?} tensors",
            DType::Bool(BoolStore::Native)
        )),
        "{error}"
    );
    // As 32-bit words, the GPU's bools are taken.
    let mut session = crate::session();
    session.run(&frame([Command::Data {
        id: TensorId::new(1),
        data: TensorData::new(vec![1u32, 0], [2]).convert_dtype(DType::Bool(BoolStore::U32)),
    }]));
    assert_eq!(session.error(), None);
}

#[cfg(target_os = "linux")]
#[test]
fn the_worker_on_a_gpu_may_not_start_programs_open_sockets_or_signal_others() {
    let out = Process::new(WORKER)
        .arg("--check-confinement")
        .args(adapter().args())
        .output()
        .expect("the worker runs");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {said}", out.status);
    assert!(said.contains("wtune-burn-worker: confined: "), "{said}");
}

#[test]
fn a_gpu_that_is_not_there_is_named_with_those_that_are() {
    let out = Process::new(WORKER)
        .args(["--memory-bytes", "1024", "--gpu-pci", "0000:ff:1f.7"])
        .output()
        .expect("the worker runs");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("the GPU at PCI address 0000:ff:1f.7 is not there: Vulkan lists"),
        "{said}"
    );
}
