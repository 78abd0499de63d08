//! The same burn code gives the same numbers, bit for bit, whether burn
//! runs it in this process or the client sends it to a host running
//! burn-router's interpreter over the same CPU backend.

mod common;

use burn::nn::conv::Conv2dConfig;
use burn::nn::pool::{AvgPool2dConfig, MaxPool2dConfig};
use burn::tensor::activation::{relu, softmax};
use burn::tensor::{Bool, Device, Distribution, Int, Tensor, TensorData};
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

/// Runs `f` on both devices and compares every tensor it returns.
fn agree(name: &str, f: impl Fn(&Device) -> Vec<TensorData>) {
    let (_host, _serial) = host();
    let (remote, local) = (remote(), local());
    remote.seed(3);
    let sent = f(&remote);
    local.seed(3);
    let kept = f(&local);
    assert_eq!(sent.len(), kept.len());
    for (i, (sent, kept)) in sent.iter().zip(&kept).enumerate() {
        assert_eq!(sent, kept, "{name}: result {i}");
    }
}

fn input(device: &Device) -> Tensor<2> {
    Tensor::<2>::from_floats(
        [
            [1.0, -2.0, 3.5, 0.25],
            [-0.5, 4.0, -1.0, 2.0],
            [0.0, 1.5, -3.0, 0.75],
        ],
        device,
    )
}

#[test]
fn matmul_and_broadcasting_agree() {
    agree("matmul", |d| {
        let x = input(d);
        let w = Tensor::<2>::random([4, 5], Distribution::Normal(0.0, 1.0), d);
        let row = Tensor::<2>::from_floats([[1.0, 2.0, 3.0, 4.0, 5.0]], d);
        vec![
            x.clone().matmul(w.clone()).into_data(),
            (x.clone().matmul(w) + row.clone()).into_data(),
            (x.clone() * x.clone().exp()).into_data(),
            x.transpose().into_data(),
        ]
    });
}

#[test]
fn convolution_and_pooling_agree() {
    agree("conv2d", |d| {
        let images = Tensor::<4>::random([2, 3, 7, 7], Distribution::Uniform(-1.0, 1.0), d);
        let conv = Conv2dConfig::new([3, 5], [3, 3])
            .with_stride([2, 2])
            .init(d);
        let max = MaxPool2dConfig::new([2, 2]).with_strides([1, 1]).init();
        let avg = AvgPool2dConfig::new([3, 3]).init();
        let y = conv.forward(images.clone());
        vec![
            y.clone().into_data(),
            max.forward(images.clone()).into_data(),
            avg.forward(images).into_data(),
            y.sum().into_data(),
        ]
    });
}

#[test]
fn softmax_and_reductions_agree() {
    agree("reductions", |d| {
        let x = input(d);
        vec![
            softmax(x.clone(), 1).into_data(),
            x.clone().sum_dim(0).into_data(),
            x.clone().mean().into_data(),
            x.clone().max_dim(1).into_data(),
            x.clone().argmax(1).into_data(),
            x.clone().var(1).into_data(),
            x.abs().sqrt().log().into_data(),
        ]
    });
}

#[test]
fn indexing_and_masks_agree() {
    agree("indexing", |d| {
        let x = input(d);
        let rows = Tensor::<1, Int>::from_ints([2, 0], d);
        let index = Tensor::<2, Int>::from_ints([[3, 0], [1, 1], [0, 2]], d);
        let mask: Tensor<2, Bool> = x.clone().greater_elem(0.5);
        let patch = Tensor::<2>::ones([2, 2], d);
        vec![
            x.clone().slice([0..2, 1..3]).into_data(),
            x.clone().select(0, rows).into_data(),
            x.clone().gather(1, index).into_data(),
            x.clone().slice_assign([1..3, 0..2], patch).into_data(),
            x.clone().mask_fill(mask.clone(), -9.0).into_data(),
            mask.into_data(),
            Tensor::cat(vec![x.clone(), x.clone()], 0)
                .reshape([6, 2, 2])
                .permute([2, 0, 1])
                .into_data(),
            x.clone().int().add_scalar(3).into_data(),
        ]
    });
}

#[test]
fn gradients_of_a_small_model_agree() {
    agree("autodiff", |d| {
        let x = input(d);
        let w = Tensor::<2>::random([4, 2], Distribution::Normal(0.0, 1.0), d).require_grad();
        let y = softmax(relu(x.matmul(w.clone())), 1).powf_scalar(2.0).sum();
        let grads = y.backward();
        vec![
            y.into_data(),
            w.grad(&grads).expect("w has a gradient").into_data(),
        ]
    });
}
