//! Fuel for a burn operation, by its work, on the same scale as the host's
//! compute interface (`wtune::compute::cost`): 100 per operation, 1 per
//! floating-point operation (a multiply-add is 2), 1 per 16 bytes moved, 20
//! per element of a transcendental function.
//!
//! The work is counted from the operation's checked shapes, before it runs,
//! so a trial that cannot pay for an operation never starts it.

use burn_ir::{
    ActivationOperationIr as Act, FloatOperationIr, ModuleOperationIr, NumericOperationIr,
    OperationIr,
};
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
        // Each output averages a window of about the input over the output
        // along each side, plus one: the windows of a side cover it
        // (input + output) positions in all.
        OperationIr::Module(M::AdaptiveAvgPool2d(p)) => {
            adaptive(&p.x.shape, p.output_size).max(out)
        }
        OperationIr::Module(M::AdaptiveAvgPool2dBackward(p)) => {
            let grad = p.grad.shape.as_slice();
            let size = [2, 3].map(|d| grad.get(d).copied().unwrap_or(1));
            adaptive(&p.x.shape, size).max(out)
        }
        // Sorting (and burn's top-k, which sorts the whole dimension)
        // compares each element about log2 of its dimension's length times.
        OperationIr::NumericFloat(_, n) | OperationIr::NumericInt(_, n) => match n {
            NumericOperationIr::Sort(s) | NumericOperationIr::ArgSort(s) => {
                sorted(&s.input.shape, s.dim).max(out)
            }
            NumericOperationIr::SortWithIndices(s) => sorted(&s.input.shape, s.dim).max(out),
            NumericOperationIr::TopK(r) | NumericOperationIr::ArgTopK(r) => {
                sorted(&r.input.shape, r.axis).max(out)
            }
            _ => out,
        },
        _ => out,
    }
}

/// Additions of an adaptive average pooling of `x` (`[n, c, h, w]`) to
/// `size`, forward or back: `n * c * (h + oh) * (w + ow)` at most.
fn adaptive(x: &Shape, size: [usize; 2]) -> u64 {
    let x = x.as_slice();
    let dim = |d: usize| x.get(d).copied().unwrap_or(1) as u64;
    let side = |d: usize, o: usize| dim(d).saturating_add(o as u64);
    dim(0)
        .saturating_mul(dim(1))
        .saturating_mul(side(2, size[0]))
        .saturating_mul(side(3, size[1]))
}

/// Comparisons of a sort of `shape` along `dim`: each element about
/// `ceil(log2(len))` times.
fn sorted(shape: &Shape, dim: usize) -> u64 {
    let len = shape.as_slice().get(dim).copied().unwrap_or(1) as u64;
    let depth = u64::from(len.max(2).next_power_of_two().trailing_zeros());
    elements(shape).saturating_mul(depth)
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn_ir::{
        AdaptiveAvgPool2dOpIr, ReduceDimOpIr, SortOpIr, TensorId, TensorIr, TensorStatus,
    };
    use burn_std::DType;

    fn tensor(id: u64, shape: &[usize]) -> TensorIr {
        TensorIr {
            id: TensorId::new(id),
            shape: Shape::from(shape.to_vec()),
            status: TensorStatus::ReadOnly,
            dtype: DType::F32,
        }
    }

    #[test]
    fn an_adaptive_pooling_is_charged_for_its_windows() {
        // 2^20 outputs, each the mean of all 2^20 rows: 2^40 additions.
        let op = OperationIr::Module(ModuleOperationIr::AdaptiveAvgPool2d(
            AdaptiveAvgPool2dOpIr {
                x: tensor(1, &[1, 1, 1 << 20, 1]),
                output_size: [1, 1 << 20],
                out: tensor(2, &[1, 1, 1, 1 << 20]),
            },
        ));
        assert!(fuel(&op) >= 1 << 40, "{}", fuel(&op));
    }

    #[test]
    fn sorts_and_top_k_are_charged_n_log_n() {
        let n = 1usize << 20;
        let sort = OperationIr::NumericFloat(
            DType::F32,
            NumericOperationIr::Sort(SortOpIr {
                input: tensor(1, &[n]),
                dim: 0,
                descending: false,
                out: tensor(2, &[n]),
            }),
        );
        let top = OperationIr::NumericFloat(
            DType::F32,
            NumericOperationIr::TopK(ReduceDimOpIr {
                input: tensor(1, &[n]),
                out: tensor(2, &[1]),
                axis: 0,
                accumulator_len: 1,
            }),
        );
        for op in [sort, top] {
            assert!(fuel(&op) >= 20 * (1 << 20), "{op:?}: {}", fuel(&op));
        }
    }
}
