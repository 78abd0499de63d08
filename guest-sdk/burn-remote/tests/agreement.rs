//! The same burn code gives the same numbers, bit for bit, whether burn
//! runs it in this process or the client sends it to a host running
//! burn-router's interpreter over the same CPU backend.

mod common;

use burn::tensor::{Tensor, TensorData};
use common::cases::{self, Case};
use common::cnn::train;
use common::{host, local, remote};

#[test]
fn a_cnn_trains_bit_identically_on_the_host_and_in_process() {
    let (host, _serial) = host();
    let before = host.traffic();
    let sent = train(&remote(), 3);
    let after = host.traffic();
    let kept = train(&local(), 3);
    assert_eq!(sent, kept);
    // The losses went down: the comparison is of a model that learns.
    let loss = |d: &TensorData| d.try_to_vec::<f32>().expect("f32 loss")[0];
    assert!(loss(&sent.0[2]) < loss(&sent.0[0]), "{:?}", sent.0);

    // Operations travel in frames, not one crossing each: the host waited
    // only for the guest's reads.
    let commands = after.commands - before.commands;
    let crossings = (after.submits - before.submits) + (after.waits - before.waits);
    eprintln!("{commands} commands in {crossings} crossings");
    assert!(commands > 400, "{commands} commands");
    assert!(
        crossings * 20 < commands,
        "{crossings} crossings for {commands} commands"
    );
    assert_eq!(
        after.waits - before.waits,
        3 + 4,
        "a read per loss and per weight"
    );
}

#[test]
fn a_full_queue_goes_to_the_host_without_waiting() {
    let (host, _serial) = host();
    let device = remote();
    let before = host.traffic();
    let mut x = Tensor::<1>::zeros([4], &device);
    for _ in 0..1000 {
        x = x.add_scalar(1.0);
    }
    let during = host.traffic();
    assert_eq!(x.into_data(), TensorData::from([1000.0f32; 4]));
    let after = host.traffic();
    // A command per step (each addition consumes its input, so nothing
    // is dropped), sent in full frames while the guest went on; the read
    // waited once.
    let submits = during.submits - before.submits;
    assert!(submits >= 1000 / 256, "{submits} frames");
    assert_eq!(during.largest_frame, 256);
    assert_eq!(during.waits, before.waits);
    assert_eq!(after.waits - during.waits, 1);
    assert!((after.commands - before.commands) > 1000);
}

/// Runs `case` on both devices, each drawing its own random numbers from
/// the same seed, and compares every tensor it returns, bit for bit.
fn agree(name: &str, case: Case) {
    let (_host, _serial) = host();
    let (remote, local) = (remote(), local());
    remote.seed(3);
    let sent = case(&remote, &remote);
    local.seed(3);
    let kept = case(&local, &local);
    assert_eq!(sent.len(), kept.len());
    for (i, (sent, kept)) in sent.iter().zip(&kept).enumerate() {
        assert_eq!(sent, kept, "{name}: result {i}");
    }
}

#[test]
fn matmul_and_broadcasting_agree() {
    agree("matmul", cases::matmul);
}

#[test]
fn convolution_and_pooling_agree() {
    agree("conv2d", cases::convolution);
}

#[test]
fn softmax_and_reductions_agree() {
    agree("reductions", cases::reductions);
}

#[test]
fn indexing_and_masks_agree() {
    agree("indexing", cases::indexing);
}

#[test]
fn gradients_of_a_small_model_agree() {
    agree("autodiff", cases::gradients);
}
