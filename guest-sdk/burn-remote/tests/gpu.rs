//! The same burn code on a GPU: a real `wtune-burn-worker` on the first
//! Vulkan adapter (lavapipe where there is no hardware one), confined by
//! its GPU filter and driven over its pipes, runs every agreement case and
//! trains the CNN to what burn's CPU backend computes in this process, to
//! float tolerance: the GPU's kernels sum in other orders.

mod common;

use std::sync::Mutex;

use burn::tensor::{DType, TensorData};
use common::cases::CASES;
use common::cnn::train_drawn;
use common::{local, remote};

/// The tests share the worker and burn's CPU generator.
static SERIAL: Mutex<()> = Mutex::new(());

/// A bool tensor's values, however its backend stores them: the GPU as
/// 32-bit words, the CPU as bytes.
fn bools(data: &TensorData) -> Vec<bool> {
    data.iter::<bool>().collect()
}

/// Asserts that `sent` and `kept` hold the same tensors: integers and
/// booleans exactly, floats to a relative 1e-4.
fn close(what: &str, sent: &[TensorData], kept: &[TensorData]) {
    assert_eq!(sent.len(), kept.len(), "{what}");
    for (i, (sent, kept)) in sent.iter().zip(kept).enumerate() {
        assert_eq!(sent.shape(), kept.shape(), "{what}: result {i}");
        if let DType::Bool(_) = kept.dtype() {
            assert_eq!(bools(sent), bools(kept), "{what}: result {i}");
            continue;
        }
        if kept.dtype() != DType::F32 {
            assert_eq!(sent, kept, "{what}: result {i}");
            continue;
        }
        let (a, b) = (
            sent.try_to_vec::<f32>().unwrap(),
            kept.try_to_vec::<f32>().unwrap(),
        );
        for (a, b) in a.iter().zip(&b) {
            assert!(
                a == b || (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                "{what}: result {i}: {a} on the GPU, {b} in process"
            );
        }
    }
}

#[test]
fn every_case_agrees_with_burn_in_process_to_float_tolerance() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    common::worker::install_on_gpu();
    let (gpu, cpu) = (remote(), local());
    for (name, case) in CASES {
        cpu.seed(3);
        let sent = case(&gpu, &cpu);
        cpu.seed(3);
        let kept = case(&cpu, &cpu);
        close(name, &sent, &kept);
    }
}

#[test]
fn a_cnn_trains_on_the_gpu_as_in_process() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    common::worker::install_on_gpu();
    let (sent, kept) = (
        train_drawn(&remote(), &local(), 0.0, 3),
        train_drawn(&local(), &local(), 0.0, 3),
    );
    close("losses", &sent.0, &kept.0);
    close("weights", &sent.1, &kept.1);
    let loss = |d: &TensorData| d.try_to_vec::<f32>().unwrap()[0];
    assert!(loss(&sent.0[2]) < loss(&sent.0[0]), "{:?}", sent.0);
}
