//! Memory an operation's backend takes beside its inputs and declared
//! outputs, counted before the operation runs, so that the trial's quota
//! bounds it ([`crate::ledger::Ledger::check_room`]).
//!
//! Most operations take a small multiple of their inputs at most. Two do
//! not, and their shapes alone would let a guest that passes every check
//! make the worker allocate tens of GiB:
//!
//! - a convolution is lowered (burn-flex) to matrix products over tiles of
//!   up to 512 output positions, each tile's input windows copied out first
//!   (im2col), one tile at a time (the worker is built without rayon, and
//!   its system call filter would not let it start threads): a tile is 512
//!   windows, and a window as large as the kernel times its input channels;
//! - a convolution's weight gradient is a convolution of the input by the
//!   output gradient, whose result spans as far as the gradient's positions
//!   reach into the padded input, and is then sliced to the weight's shape.
//!   With strides wider than the kernel it is far larger than the weight,
//!   and the slice keeps all of it.
//!
//! The count is an upper bound: the GPU backend (cubecl) takes its own
//! scratch, which this does not model, and is held to the same bound.

use burn_ir::{ModuleOperationIr as M, OperationIr};
use burn_std::Shape;

use crate::cost::window;

/// Output positions burn-flex copies input windows for at once, per thread.
const TILE: u64 = 512;

/// Elements `op` holds beside its inputs and declared outputs while it
/// runs (and, for a weight gradient, keeps under its output). `op`'s
/// shapes have been checked.
pub fn elements_of(op: &OperationIr) -> u64 {
    let OperationIr::Module(module) = op else {
        return 0;
    };
    match module {
        M::Conv1d(c) => im2col(&c.weight.shape, &c.out.shape)
            .saturating_add(padded_copies(&c.x.shape, &c.options.padding)),
        M::Conv2d(c) => im2col(&c.weight.shape, &c.out.shape)
            .saturating_add(padded_copies(&c.x.shape, &c.options.padding)),
        M::Conv1dWeightBackward(c) => weight_gradient(
            &c.x.shape,
            &c.weight.shape,
            &c.output_grad.shape,
            &Spacing::of(&c.options.stride, &c.options.padding, &c.options.dilation),
        )
        .saturating_add(padded_copies(&c.x.shape, &c.options.padding)),
        M::Conv2dWeightBackward(c) => weight_gradient(
            &c.x.shape,
            &c.weight.shape,
            &c.output_grad.shape,
            &Spacing::of(&c.options.stride, &c.options.padding, &c.options.dilation),
        )
        .saturating_add(padded_copies(&c.x.shape, &c.options.padding)),
        _ => 0,
    }
}

/// A convolution's strides, paddings (before, after) and dilations, per
/// spatial dimension.
struct Spacing {
    stride: Vec<u64>,
    padding: Vec<u64>,
    dilation: Vec<u64>,
}

impl Spacing {
    fn of(stride: &[usize], padding: &[(usize, usize)], dilation: &[usize]) -> Self {
        Self {
            stride: stride.iter().map(|&s| s as u64).collect(),
            padding: padding
                .iter()
                .map(|&(a, b)| (a as u64).saturating_add(b as u64))
                .collect(),
            dilation: dilation.iter().map(|&d| (d as u64).max(1)).collect(),
        }
    }
}

/// The spatial extent of `shape` (`[batch, channels, spatial...]`).
fn spatial(shape: &Shape) -> u64 {
    shape.as_slice().get(2..).map_or(1, |s| {
        s.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64))
    })
}

/// Padding that differs before and after is applied by copying the input,
/// padded (burn's `pad_asymmetric_conv_input`), which the convolution then
/// copies again into its own layout: twice the padded input, which a wide
/// padding (allowed up to the dilated kernel's reach) makes far larger than
/// the input. Symmetric padding is read in place.
fn padded_copies(x: &Shape, padding: &[(usize, usize)]) -> u64 {
    if padding.iter().all(|(before, after)| before == after) {
        return 0;
    }
    let x = x.as_slice();
    let padded = padding.iter().enumerate().fold(1u64, |n, (d, &(a, b))| {
        let extent = x.get(2 + d).map_or(1, |&e| e as u64);
        n.saturating_mul(extent.saturating_add(a as u64).saturating_add(b as u64))
    });
    let batch_channels = x[..x.len().min(2)]
        .iter()
        .fold(1u64, |n, &d| n.saturating_mul(d as u64));
    batch_channels.saturating_mul(padded).saturating_mul(2)
}

/// The im2col tile of a convolution by `weight` into `out`: up to
/// [`TILE`] of the output's positions, each a window of the weight's size.
fn im2col(weight: &Shape, out: &Shape) -> u64 {
    spatial(out).min(TILE).saturating_mul(window(weight))
}

/// A weight gradient's convolution (see the module docs): its result, of
/// every input channel by every output channel over the extent the
/// gradient reaches, and its own im2col tiles, whose windows are the
/// batch's gradients of one output channel.
fn weight_gradient(x: &Shape, weight: &Shape, grad: &Shape, spacing: &Spacing) -> u64 {
    let reached = reached(x, grad, spacing);
    let in_channels = x.as_slice().get(1).map_or(1, |&c| c as u64);
    let out_channels = weight.as_slice().first().map_or(1, |&c| c as u64);
    let result = in_channels
        .saturating_mul(out_channels)
        .saturating_mul(reached);
    let batch = grad.as_slice().first().map_or(1, |&n| n as u64);
    let window = batch.saturating_mul(spatial(grad));
    result.saturating_add(reached.min(TILE).saturating_mul(window))
}

/// The positions a weight gradient's convolution computes per pair of
/// channels: along each spatial dimension, the padded input's span past
/// the gradient's reach, in steps of the dilation. The weight's kernel
/// when the strides leave no input unread past it; more when they do.
fn reached(x: &Shape, grad: &Shape, spacing: &Spacing) -> u64 {
    let (x, grad) = (x.as_slice(), grad.as_slice());
    (0..spacing.stride.len())
        .map(|d| {
            let input = x.get(2 + d).map_or(1, |&n| n as u64);
            let positions = grad.get(2 + d).map_or(1, |&n| n as u64);
            let reach = spacing.stride[d]
                .saturating_mul(positions.saturating_sub(1))
                .saturating_add(1);
            input
                .saturating_add(spacing.padding[d])
                .saturating_sub(reach)
                / spacing.dilation[d]
                + 1
        })
        .fold(1u64, u64::saturating_mul)
}

/// The window each element of a weight gradient's result is a dot product
/// over, per output element of the batch's gradient: the input channels
/// per group times [`reached`], and never less than the weight's own
/// window. The weight gradient's fuel is counted over it.
pub fn weight_gradient_window(
    x: &Shape,
    weight: &Shape,
    grad: &Shape,
    stride: &[usize],
    padding: &[(usize, usize)],
    dilation: &[usize],
) -> u64 {
    let spacing = Spacing::of(stride, padding, dilation);
    let per_group = weight.as_slice().get(1).map_or(1, |&c| c as u64);
    per_group
        .saturating_mul(reached(x, grad, &spacing))
        .max(window(weight))
}
