//! The computations the agreement tests run on two devices and compare:
//! matmul and broadcasting, convolution and pooling, softmax and
//! reductions, indexing and masks, and the gradients of a small model.
//!
//! Each case computes on `d` and draws its random inputs and weights on
//! `draw`: on `d` itself where both sides share a generator (burn's CPU
//! backend in and out of the worker), else on one device for both sides
//! and moved to `d`, since a GPU's generator draws other numbers.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::conv::Conv2dConfig;
use burn::nn::pool::{AvgPool2dConfig, MaxPool2dConfig};
use burn::tensor::activation::{relu, softmax};
use burn::tensor::{Bool, Device, Distribution, Int, Tensor, TensorData};

/// A case: the tensors it computes on `d`, its random inputs drawn on
/// `draw`.
pub type Case = fn(&Device, &Device) -> Vec<TensorData>;

/// Every case, by name.
pub const CASES: [(&str, Case); 5] = [
    ("matmul", matmul),
    ("conv2d", convolution),
    ("reductions", reductions),
    ("indexing", indexing),
    ("autodiff", gradients),
];

/// `module` with its parameters drawn now, on the device it was made
/// for: burn draws them lazily, at first use, and a module moved first
/// would draw them where it was moved to.
pub fn drawn<M: Module>(module: M) -> M {
    struct Draw;
    impl ModuleVisitor for Draw {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            param.val();
        }
    }
    module.visit(&mut Draw);
    module
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

pub fn matmul(d: &Device, draw: &Device) -> Vec<TensorData> {
    let x = input(d);
    let w = Tensor::<2>::random([4, 5], Distribution::Normal(0.0, 1.0), draw).to_device(d);
    let row = Tensor::<2>::from_floats([[1.0, 2.0, 3.0, 4.0, 5.0]], d);
    vec![
        x.clone().matmul(w.clone()).into_data(),
        (x.clone().matmul(w) + row.clone()).into_data(),
        (x.clone() * x.clone().exp()).into_data(),
        x.transpose().into_data(),
    ]
}

pub fn convolution(d: &Device, draw: &Device) -> Vec<TensorData> {
    let images =
        Tensor::<4>::random([2, 3, 7, 7], Distribution::Uniform(-1.0, 1.0), draw).to_device(d);
    let conv = drawn(
        Conv2dConfig::new([3, 5], [3, 3])
            .with_stride([2, 2])
            .init(draw),
    )
    .to_device(d);
    let max = MaxPool2dConfig::new([2, 2]).with_strides([1, 1]).init();
    let avg = AvgPool2dConfig::new([3, 3]).init();
    let y = conv.forward(images.clone());
    vec![
        y.clone().into_data(),
        max.forward(images.clone()).into_data(),
        avg.forward(images).into_data(),
        y.sum().into_data(),
    ]
}

pub fn reductions(d: &Device, _draw: &Device) -> Vec<TensorData> {
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
}

pub fn indexing(d: &Device, _draw: &Device) -> Vec<TensorData> {
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
}

pub fn gradients(d: &Device, draw: &Device) -> Vec<TensorData> {
    let x = input(d);
    let w = Tensor::<2>::random([4, 2], Distribution::Normal(0.0, 1.0), draw)
        .to_device(d)
        .require_grad();
    let y = softmax(relu(x.matmul(w.clone())), 1).powf_scalar(2.0).sum();
    let grads = y.backward();
    vec![
        y.into_data(),
        w.grad(&grads).expect("w has a gradient").into_data(),
    ]
}
