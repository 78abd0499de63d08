//! Fuel for a burn operation, by its work, on the same scale as the host's
//! compute interface (`wtune::compute::cost`): 100 per operation, 1 per
//! floating-point operation (a multiply-add is 2), 1 per 16 bytes moved, 20
//! per element of a transcendental function.
//!
//! The work is counted from the operation's checked shapes, before it runs,
//! so a trial that cannot pay for an operation never starts it.

use burn_ir::{ActivationOperationIr as Act, FloatOperationIr, ModuleOperationIr, OperationIr};
use burn_std::Shape;

use crate::scratch;

/// Fuel every operation costs, whatever it does.
pub const PER_OPERATION: u64 = 100;
/// Bytes moved per unit of fuel.
pub const BYTES_PER_FUEL: u64 = 16;
/// Fuel per element of exp, log, tanh, erf and the like.
pub const PER_TRANSCENDENTAL: u64 = 20;

pub(crate) fn elements(shape: &Shape) -> u64 {
    shape.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64))
}

/// Fuel for `op`, whose shapes have been checked.
pub fn fuel(op: &OperationIr) -> u64 {
    let bytes: u64 = op
        .inputs()
        .chain(op.outputs())
        .map(|t| elements(&t.shape).saturating_mul(t.dtype.size() as u64))
        .fold(0, u64::saturating_add);
    let out: u64 = op
        .outputs()
        .map(|t| elements(&t.shape))
        .fold(0, u64::saturating_add);
    PER_OPERATION
        .saturating_add(bytes / BYTES_PER_FUEL)
        .saturating_add(flops(op, out))
}

/// Fuel for tensor data the guest sends: its bytes.
pub fn data_fuel(bytes: u64) -> u64 {
    PER_OPERATION.saturating_add(bytes / BYTES_PER_FUEL)
}

/// Floating-point operations, for an operation with `out` output elements.
fn flops(op: &OperationIr, out: u64) -> u64 {
    use FloatOperationIr as F;
    use ModuleOperationIr as M;
    let mul_add = |a: u64, b: u64| a.saturating_mul(b).saturating_mul(2);
    match op {
        OperationIr::Float(_, F::Matmul(m))
        | OperationIr::Int(burn_ir::IntOperationIr::Matmul(m)) => {
            let inner = m.lhs.shape.as_slice().last().copied().unwrap_or(1) as u64;
            mul_add(out, inner)
        }
        OperationIr::Float(
            _,
            F::Exp(_) | F::Log(_) | F::Log1p(_) | F::Erf(_) | F::Tanh(_) | F::Sin(_) | F::Cos(_),
        )
        | OperationIr::Float(_, F::Powf(_) | F::PowfScalar(_))
        | OperationIr::Activation(
            Act::Gelu(_) | Act::Sigmoid(_) | Act::Softmax(_) | Act::LogSoftmax(_) | Act::Softmin(_),
        ) => out.saturating_mul(PER_TRANSCENDENTAL),
        OperationIr::Module(M::Linear(l)) => mul_add(out, l.weight.shape[0] as u64),
        OperationIr::Module(M::LinearXBackward(l)) => mul_add(out, l.weight.shape[1] as u64),
        OperationIr::Module(M::LinearWeightBackward(l)) => {
            let rows = elements(&l.x.shape)
                / (l.x.shape.as_slice().last().copied().unwrap_or(1).max(1) as u64);
            mul_add(out, rows)
        }
        // Each output (or gradient) element of a convolution is a dot
        // product over a kernel window of the input channels in its group.
        OperationIr::Module(M::Conv2d(c)) => mul_add(out, window(&c.weight.shape)),
        OperationIr::Module(M::Conv1d(c)) => mul_add(out, window(&c.weight.shape)),
        OperationIr::Module(M::Conv2dXBackward(c)) => {
            mul_add(elements(&c.output_grad.shape), window(&c.weight.shape))
        }
        // Over the extent the gradient reaches (`scratch`): wider than the
        // kernel when the strides are.
        OperationIr::Module(M::Conv2dWeightBackward(c)) => mul_add(
            elements(&c.output_grad.shape),
            scratch::weight_gradient_window(
                &c.x.shape,
                &c.weight.shape,
                &c.output_grad.shape,
                &c.options.stride,
                &c.options.padding,
                &c.options.dilation,
            ),
        ),
        OperationIr::Module(M::Conv1dXBackward(c)) => {
            mul_add(elements(&c.output_grad.shape), window(&c.weight.shape))
        }
        OperationIr::Module(M::Conv1dWeightBackward(c)) => mul_add(
            elements(&c.output_grad.shape),
            scratch::weight_gradient_window(
                &c.x.shape,
                &c.weight.shape,
                &c.output_grad.shape,
                &c.options.stride,
                &c.options.padding,
                &c.options.dilation,
            ),
        ),
        // A pooling window's every element is compared or added, forward
        // and back.
        OperationIr::Module(M::MaxPool2d(p)) => out.saturating_mul(area(p.kernel_size)),
        OperationIr::Module(M::MaxPool2dWithIndices(p)) => out.saturating_mul(area(p.kernel_size)),
        OperationIr::Module(M::MaxPool2dWithIndicesBackward(p)) => {
            elements(&p.grad.shape).saturating_mul(area(p.kernel_size))
        }
        OperationIr::Module(M::AvgPool2d(p)) => out.saturating_mul(area(p.kernel_size)),
        OperationIr::Module(M::AvgPool2dBackward(p)) => {
            elements(&p.grad.shape).saturating_mul(area(p.kernel_size))
        }
        OperationIr::Module(M::AdaptiveAvgPool2d(p)) => elements(&p.x.shape).max(out),
        _ => out,
    }
}

/// Elements in a pooling window.
fn area(kernel: [usize; 2]) -> u64 {
    (kernel[0] as u64).saturating_mul(kernel[1] as u64)
}

/// A convolution kernel's window: input channels per group times the
/// kernel's extent.
pub(crate) fn window(weight: &Shape) -> u64 {
    weight.as_slice()[1..]
        .iter()
        .fold(1u64, |n, &d| n.saturating_mul(d as u64))
}
