//! The shapes an operation's outputs must have, worked out from its inputs.
//!
//! burn's CPU kernels size their outputs and index their buffers from the
//! shapes of the tensors they are given, partly in unchecked code: an
//! operation whose inputs do not fit together (a convolution's channels, a
//! matmul's inner dimension, a gradient of the wrong size) must never reach
//! them. So every operation the host runs is on this list, and for each one
//! the shapes its outputs must have are computed here from its inputs
//! (which the ledger has checked are the trial's, as described). The
//! worker then refuses an operation whose declared outputs differ, and sizes
//! the quota and fuel from shapes that are true.
//!
//! Operations not on the list are refused with their name. The list covers
//! what burn's layers, losses, autodiff and optimizers use for MLPs and
//! CNNs; growing it is a matter of adding the operation's rule here and an
//! agreement test in burn-remote.

use burn_ir::ActivationOperationIr as Act;
use burn_ir::{
    BaseOperationIr, BinaryOpIr, BoolOperationIr, Conv1dOptionsIr, Conv2dOptionsIr, DimOpIr,
    FloatOperationIr, IntOperationIr, ModuleOperationIr, NumericOperationIr, OperationIr,
    ReduceDimOpIr, TensorIr,
};
use burn_std::{Shape, SliceOps, calculate_matmul_output};

use crate::ledger::shown;

type Shapes = Result<Vec<Shape>, String>;

/// The shapes `op`'s outputs must have, in the order of `op.outputs()`, or
/// why the host does not run it.
pub fn expected(op: &OperationIr) -> Shapes {
    match op {
        OperationIr::BaseFloat(op) | OperationIr::BaseInt(op) | OperationIr::BaseBool(op) => {
            base(op)
        }
        OperationIr::NumericFloat(_, op) | OperationIr::NumericInt(_, op) => numeric(op),
        OperationIr::Float(_, op) => float(op),
        OperationIr::Int(op) => int(op),
        OperationIr::Bool(op) => boolean(op),
        OperationIr::Module(op) => module(op),
        OperationIr::Activation(op) => activation(op),
        // Names a tensor the guest sent as data: nothing is made.
        OperationIr::Init(_) => Ok(Vec::new()),
        OperationIr::Drop(_) => Ok(Vec::new()),
        OperationIr::Custom(op) => unsupported(&format!("the custom operation {:?}", op.id)),
        OperationIr::Distributed(_) => unsupported("distributed operations"),
    }
}

/// The operation's name, as errors show it: `Float(Matmul)`.
pub fn name(op: &OperationIr) -> String {
    // Debug prints `Float(F32, Matmul(MatmulOpIr { .. }))`: keep the
    // variants' names, without the fields, the dtype and the structs.
    let text = format!("{op:?}");
    let head = text.split('{').next().unwrap_or_default();
    let names: Vec<&str> = head
        .split('(')
        .filter_map(|part| part.rsplit(',').next())
        .map(|part| part.trim().trim_end_matches(')'))
        .filter(|part| !part.is_empty() && !part.ends_with("Ir"))
        .collect();
    names.join("(") + &")".repeat(names.len().saturating_sub(1))
}

fn unsupported(what: &str) -> Shapes {
    Err(format!(
        "{what} is not among the operations the host runs yet \
         (see wtune-burn-worker's shapes.rs for the list)"
    ))
}

fn one(shape: Shape) -> Shapes {
    Ok(vec![shape])
}

fn same(input: &TensorIr) -> Shapes {
    one(input.shape.clone())
}

/// The one output burn's own shape rule gives, or `why` it gives none.
fn ruled<E>(shape: Result<Shape, E>, why: impl FnOnce() -> String) -> Shapes {
    shape.map(|s| vec![s]).map_err(|_| why())
}

fn broadcast(lhs: &TensorIr, rhs: &TensorIr) -> Shapes {
    ruled(lhs.shape.broadcast(&rhs.shape), || {
        format!(
            "shapes {} and {} do not broadcast",
            shown(&lhs.shape),
            shown(&rhs.shape)
        )
    })
}

fn binary(op: &BinaryOpIr) -> Shapes {
    broadcast(&op.lhs, &op.rhs)
}

fn check(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(why()) }
}

fn dim_of(tensor: &TensorIr, dim: usize) -> Result<usize, String> {
    tensor.shape.as_slice().get(dim).copied().ok_or_else(|| {
        format!(
            "dimension {dim} of a tensor of shape {}",
            shown(&tensor.shape)
        )
    })
}

fn last_dim(tensor: &TensorIr) -> Result<usize, String> {
    let rank = tensor.shape.rank();
    check(rank > 0, || "a tensor of no dimensions".into())?;
    dim_of(tensor, rank - 1)
}

fn with_dim(shape: &Shape, dim: usize, size: usize) -> Shape {
    let mut shape = shape.clone();
    shape[dim] = size;
    shape
}

/// A reduction along `axis` to `accumulator_len` values, at most `most`.
fn reduce_dim(op: &ReduceDimOpIr, most: Option<usize>) -> Shapes {
    let size = dim_of(&op.input, op.axis)?;
    let most = most.unwrap_or(size).min(size);
    check(
        op.accumulator_len >= 1 && op.accumulator_len <= most,
        || {
            format!(
                "{} values along dimension {} of {}",
                op.accumulator_len,
                op.axis,
                shown(&op.input.shape)
            )
        },
    )?;
    one(with_dim(&op.input.shape, op.axis, op.accumulator_len))
}

fn along(op: &DimOpIr) -> Shapes {
    dim_of(&op.input, op.axis)?;
    same(&op.input)
}

fn base(op: &BaseOperationIr) -> Shapes {
    use BaseOperationIr as B;
    match op {
        B::Reshape(op) => {
            check(
                op.input.shape.num_elements() == op.out.shape.num_elements(),
                || {
                    format!(
                        "a reshape from {} to {}",
                        shown(&op.input.shape),
                        shown(&op.out.shape)
                    )
                },
            )?;
            same(&op.out)
        }
        B::Expand(op) => ruled(op.input.shape.expand(op.out.shape.clone()), || {
            format!(
                "{} does not expand to {}",
                shown(&op.input.shape),
                shown(&op.out.shape)
            )
        }),
        B::SwapDims(op) => {
            dim_of(&op.input, op.dim1)?;
            dim_of(&op.input, op.dim2)?;
            one(op
                .input
                .shape
                .clone()
                .swapped(op.dim1, op.dim2)
                .map_err(|e| format!("{e:?}"))?)
        }
        B::Permute(op) => {
            let rank = op.input.shape.rank();
            let mut seen = vec![false; rank];
            let permutation = op.axes.len() == rank
                && op
                    .axes
                    .iter()
                    .all(|&a| a < rank && !std::mem::replace(&mut seen[a], true));
            check(permutation, || {
                format!("axes {:?} do not permute {rank} dimensions", op.axes)
            })?;
            one(op
                .axes
                .iter()
                .map(|&a| op.input.shape[a])
                .collect::<Vec<_>>()
                .into())
        }
        B::Flip(op) => {
            // burn-flex flips by negating strides, once per axis named: an
            // axis named twice would start the view past its buffer.
            let rank = op.input.shape.rank();
            let mut seen = vec![false; rank];
            let distinct = op
                .axes
                .iter()
                .all(|&a| a < rank && !std::mem::replace(&mut seen[a], true));
            check(distinct, || {
                format!(
                    "flip axes {:?} are not distinct axes of {rank} dimensions",
                    op.axes
                )
            })?;
            same(&op.input)
        }
        B::Slice(op) => one(sliced(&op.tensor, &op.ranges)?),
        B::SliceAssign(op) => {
            let region = sliced(&op.tensor, &op.ranges)?;
            check(region == op.value.shape, || {
                format!(
                    "a value of shape {} assigned to a slice of shape {}",
                    shown(&op.value.shape),
                    shown(&region)
                )
            })?;
            same(&op.tensor)
        }
        B::Select(op) => {
            dim_of(&op.tensor, op.dim)?;
            check(op.indices.shape.rank() == 1, || {
                "select's indices must be 1-D".into()
            })?;
            one(with_dim(&op.tensor.shape, op.dim, op.indices.shape[0]))
        }
        B::SelectAssign(op) => {
            dim_of(&op.tensor, op.dim)?;
            check(op.indices.shape.rank() == 1, || {
                "select's indices must be 1-D".into()
            })?;
            let region = with_dim(&op.tensor.shape, op.dim, op.indices.shape[0]);
            check(region == op.value.shape, || {
                format!(
                    "a value of shape {} assigned where {} fits",
                    shown(&op.value.shape),
                    shown(&region)
                )
            })?;
            same(&op.tensor)
        }
        // Off the gathered or scattered dimension, an index's position is
        // the tensor's: the GPU's kernels read and write there unchecked.
        B::Gather(op) => {
            dim_of(&op.tensor, op.dim)?;
            let (tensor, indices) = (&op.tensor.shape, &op.indices.shape);
            check(
                indices.rank() == tensor.rank()
                    && (0..tensor.rank()).all(|d| d == op.dim || indices[d] == tensor[d]),
                || {
                    format!(
                        "gather's indices {} must have the shape of the tensor {} but along \
                         dimension {}",
                        shown(indices),
                        shown(tensor),
                        op.dim
                    )
                },
            )?;
            same(&op.indices)
        }
        B::Scatter(op) => {
            dim_of(&op.tensor, op.dim)?;
            let (tensor, indices) = (&op.tensor.shape, &op.indices.shape);
            check(
                indices.rank() == tensor.rank()
                    && *indices == op.value.shape
                    && (0..tensor.rank()).all(|d| d == op.dim || indices[d] <= tensor[d]),
                || {
                    format!(
                        "scatter's indices {} and values {} must have one shape, of the \
                         tensor's rank and within the tensor {} but along dimension {}",
                        shown(indices),
                        shown(&op.value.shape),
                        shown(tensor),
                        op.dim
                    )
                },
            )?;
            same(&op.tensor)
        }
        B::MaskWhere(op) => {
            let shapes = [&op.tensor.shape, &op.mask.shape, &op.value.shape];
            ruled(Shape::broadcast_many(shapes), || {
                "mask_where's tensor, mask and value do not broadcast".into()
            })
        }
        B::MaskFill(op) => broadcast(&op.tensor, &op.mask),
        B::Equal(op) | B::NotEqual(op) => binary(op),
        B::EqualElem(op) | B::NotEqualElem(op) => same(&op.lhs),
        B::RepeatDim(op) => {
            let size = dim_of(&op.tensor, op.dim)?;
            let repeated = size.checked_mul(op.times).ok_or_else(|| {
                format!(
                    "repeating dimension {} {} times overflows",
                    op.dim, op.times
                )
            })?;
            one(with_dim(&op.tensor.shape, op.dim, repeated))
        }
        B::Cat(op) => {
            let first = op.tensors.first().ok_or("cat of no tensors")?;
            dim_of(first, op.dim)?;
            ruled(
                Shape::cat(op.tensors.iter().map(|t| &t.shape), op.dim),
                || "cat of tensors whose other dimensions differ".into(),
            )
        }
        B::Cast(op) => same(&op.input),
        B::Empty(op) | B::Ones(op) | B::Zeros(op) => same(&op.out),
        B::All(_) | B::Any(_) => one([1].into()),
        B::AllDim(op) | B::AnyDim(op) => reduce_dim(op, Some(1)),
        B::Unfold(op) => {
            let size = dim_of(&op.input, op.dim)?;
            check(op.size >= 1 && op.step >= 1 && op.size <= size, || {
                format!(
                    "windows of {} every {} along a dimension of {size}",
                    op.size, op.step
                )
            })?;
            let mut shape = with_dim(&op.input.shape, op.dim, (size - op.size) / op.step + 1);
            shape.push(op.size);
            one(shape)
        }
        B::ScatterNd(_) => unsupported("scatter_nd"),
        B::GatherNd(_) => unsupported("gather_nd"),
    }
}

/// A slice of `tensor`: every step nonzero, and no wider than the tensor.
fn sliced(tensor: &TensorIr, ranges: &[burn_std::Slice]) -> Result<Shape, String> {
    check(ranges.iter().all(|r| r.step != 0), || {
        "a slice with step 0".into()
    })?;
    let shape = tensor.shape.clone().slice(ranges).map_err(|_| {
        format!(
            "{} ranges for a tensor of shape {}",
            ranges.len(),
            shown(&tensor.shape)
        )
    })?;
    check(
        shape.iter().zip(tensor.shape.iter()).all(|(o, i)| o <= i),
        || "a slice wider than its tensor".into(),
    )?;
    Ok(shape)
}

fn numeric(op: &NumericOperationIr) -> Shapes {
    use NumericOperationIr as N;
    match op {
        N::Add(op) | N::Sub(op) | N::Div(op) | N::Rem(op) | N::Mul(op) | N::Powi(op) => binary(op),
        N::Greater(op) | N::GreaterEqual(op) | N::Lower(op) | N::LowerEqual(op) => binary(op),
        N::AddScalar(op) | N::SubScalar(op) | N::DivScalar(op) | N::RemScalar(op) => same(&op.lhs),
        N::MulScalar(op) | N::PowiScalar(op) | N::ClampMin(op) | N::ClampMax(op) => same(&op.lhs),
        N::GreaterElem(op) | N::GreaterEqualElem(op) | N::LowerElem(op) | N::LowerEqualElem(op) => {
            same(&op.lhs)
        }
        N::Abs(op) | N::Neg(op) | N::Sign(op) => same(&op.input),
        N::Clamp(op) => same(&op.tensor),
        N::Full(op) => same(&op.out),
        N::IntRandom(op) => same(&op.out),
        N::Mean(_) | N::Sum(_) | N::Prod(_) | N::Max(_) | N::Min(_) | N::MaxAbs(_) => {
            one([1].into())
        }
        N::MeanDim(op) | N::SumDim(op) | N::ProdDim(op) | N::ArgMax(op) | N::ArgMin(op) => {
            reduce_dim(op, Some(1))
        }
        N::MaxDim(op) | N::MinDim(op) | N::MaxAbsDim(op) => reduce_dim(op, Some(1)),
        N::TopK(op) | N::ArgTopK(op) => reduce_dim(op, None),
        N::SumDims(op) => {
            let mut shape = op.input.shape.clone();
            for &axis in &op.axes {
                dim_of(&op.input, axis)?;
                shape[axis] = 1;
            }
            one(shape)
        }
        N::MaxDimWithIndices(op) | N::MinDimWithIndices(op) => {
            dim_of(&op.tensor, op.dim)?;
            let shape = with_dim(&op.tensor.shape, op.dim, 1);
            Ok(vec![shape.clone(), shape])
        }
        N::CumSum(op) | N::CumProd(op) | N::CumMin(op) | N::CumMax(op) => along(op),
        N::Sort(op) | N::ArgSort(op) => {
            dim_of(&op.input, op.dim)?;
            same(&op.input)
        }
        N::SortWithIndices(op) => {
            dim_of(&op.input, op.dim)?;
            Ok(vec![op.input.shape.clone(), op.input.shape.clone()])
        }
        N::Pad(op) => {
            // One (before, after) pair per dimension, as burn validates.
            check(op.padding.len() == op.input.shape.rank(), || {
                format!(
                    "{} paddings for a tensor of {} dimensions",
                    op.padding.len(),
                    op.input.shape.rank()
                )
            })?;
            let mut shape = op.input.shape.clone();
            for (dim, &(before, after)) in op.padding.iter().enumerate() {
                shape[dim] = shape[dim]
                    .checked_add(before)
                    .and_then(|s| s.checked_add(after))
                    .ok_or("a padding that overflows")?;
            }
            one(shape)
        }
        N::TopKWithIndices(_) => unsupported("topk_with_indices"),
    }
}

fn float(op: &FloatOperationIr) -> Shapes {
    use FloatOperationIr as F;
    match op {
        F::Exp(op) | F::Log(op) | F::Log1p(op) | F::Erf(op) | F::Sqrt(op) | F::Recip(op) => {
            same(&op.input)
        }
        F::Cos(op) | F::Cosh(op) | F::Sin(op) | F::Sinh(op) | F::Tan(op) | F::Tanh(op) => {
            same(&op.input)
        }
        F::ArcCos(op) | F::ArcCosh(op) | F::ArcSin(op) | F::ArcSinh(op) | F::ArcTan(op) => {
            same(&op.input)
        }
        F::ArcTanh(op) | F::Round(op) | F::Floor(op) | F::Ceil(op) | F::Trunc(op) => {
            same(&op.input)
        }
        F::IsNan(op) | F::IsInf(op) => same(&op.input),
        F::PowfScalar(op) => same(&op.lhs),
        F::ArcTan2(op) | F::Powf(op) | F::Hypot(op) => binary(op),
        F::IntoInt(op) => same(&op.input),
        F::Matmul(op) => matmul(&op.lhs, &op.rhs),
        F::Random(op) => same(&op.out),
        F::Cross(_) => unsupported("cross"),
        F::Quantize(_) | F::Dequantize(_) => unsupported("quantization"),
        F::GridSample2d(_) => unsupported("grid_sample_2d"),
    }
}

fn matmul(lhs: &TensorIr, rhs: &TensorIr) -> Shapes {
    let fits = lhs.shape.rank() >= 2
        && lhs.shape.rank() == rhs.shape.rank()
        && lhs.shape[lhs.shape.rank() - 1] == rhs.shape[rhs.shape.rank() - 2];
    check(fits, || {
        format!("a matmul of {} by {}", shown(&lhs.shape), shown(&rhs.shape))
    })?;
    ruled(calculate_matmul_output(&lhs.shape, &rhs.shape), || {
        format!(
            "a matmul of {} by {}: the batch dimensions do not broadcast",
            shown(&lhs.shape),
            shown(&rhs.shape)
        )
    })
}

fn int(op: &IntOperationIr) -> Shapes {
    use IntOperationIr as I;
    match op {
        I::IntoFloat(op) => same(&op.input),
        I::BitwiseAnd(op) | I::BitwiseOr(op) | I::BitwiseXor(op) => binary(op),
        I::BitwiseLeftShift(op) | I::BitwiseRightShift(op) => binary(op),
        I::BitwiseAndScalar(op) | I::BitwiseOrScalar(op) | I::BitwiseXorScalar(op) => same(&op.lhs),
        I::BitwiseLeftShiftScalar(op) | I::BitwiseRightShiftScalar(op) => same(&op.lhs),
        I::BitwiseNot(op) => same(&op.input),
        I::Matmul(op) => matmul(&op.lhs, &op.rhs),
    }
}

fn boolean(op: &BoolOperationIr) -> Shapes {
    use BoolOperationIr as B;
    match op {
        B::IntoFloat(op) | B::IntoInt(op) => same(&op.input),
        B::Not(op) => same(&op.input),
        B::And(op) | B::Or(op) | B::Xor(op) => binary(op),
    }
}

fn activation(op: &Act) -> Shapes {
    match op {
        Act::Relu(op) | Act::Gelu(op) | Act::Sigmoid(op) | Act::LogSigmoid(op) => same(&op.input),
        Act::ReluBackward(op)
        | Act::GeluBackward(op)
        | Act::SigmoidBackward(op)
        | Act::LogSigmoidBackward(op) => {
            check(op.lhs.shape == op.rhs.shape, || {
                format!(
                    "a gradient of shape {} for a tensor of shape {}",
                    shown(&op.rhs.shape),
                    shown(&op.lhs.shape)
                )
            })?;
            same(&op.lhs)
        }
        Act::LeakyRelu(op) => same(&op.lhs),
        Act::HardSigmoid(op) => same(&op.tensor),
        Act::Softmax(op) | Act::LogSoftmax(op) | Act::Softmin(op) => along(op),
        Act::PRelu(_) => unsupported("prelu"),
    }
}

/// Convolution options the kernels can run: positive strides, dilations
/// and groups, and a kernel that fits in the padded input.
fn conv_output<const N: usize>(
    x: &TensorIr,
    weight: &TensorIr,
    bias: Option<&TensorIr>,
    stride: [usize; N],
    padding: [(usize, usize); N],
    dilation: [usize; N],
    groups: usize,
) -> Result<Shape, String> {
    let (xs, ws) = (&x.shape, &weight.shape);
    check(xs.rank() == N + 2 && ws.rank() == N + 2, || {
        format!(
            "a {N}-D convolution of {} with weights {}",
            shown(xs),
            shown(ws)
        )
    })?;
    check(
        groups >= 1 && stride.iter().all(|&s| s >= 1) && dilation.iter().all(|&d| d >= 1),
        || "a convolution's stride, dilation and groups must be at least 1".into(),
    )?;
    check(
        ws[0] % groups == 0 && Some(xs[1]) == ws[1].checked_mul(groups),
        || {
            format!(
                "input channels {} do not match weights {} in {groups} groups",
                xs[1],
                shown(ws)
            )
        },
    )?;
    if let Some(bias) = bias {
        check(bias.shape.as_slice() == [ws[0]], || {
            format!(
                "a bias of shape {} for {} output channels",
                shown(&bias.shape),
                ws[0]
            )
        })?;
    }
    let mut out = xs.clone();
    out[1] = ws[0];
    for i in 0..N {
        let padded = xs[i + 2]
            .checked_add(padding[i].0)
            .and_then(|p| p.checked_add(padding[i].1));
        let reach = (ws[i + 2].max(1) - 1)
            .checked_mul(dilation[i])
            .and_then(|r| r.checked_add(1));
        // burn-flex copies the input into a padded buffer first: padding
        // wider than the kernel reaches would make that copy, uncharged,
        // as large as the guest likes.
        let (before, after) = padding[i];
        match (padded, reach) {
            (Some(padded), Some(reach))
                if ws[i + 2] >= 1 && reach <= padded && before < reach && after < reach =>
            {
                out[i + 2] = (padded - reach) / stride[i] + 1;
            }
            _ => {
                return Err(format!(
                    "a kernel of {} does not fit an input of {} with padding {:?} \
                     (each side less than the kernel's reach)",
                    shown(ws),
                    shown(xs),
                    padding
                ));
            }
        }
    }
    Ok(out)
}

fn conv1d(
    x: &TensorIr,
    w: &TensorIr,
    b: Option<&TensorIr>,
    o: &Conv1dOptionsIr,
) -> Result<Shape, String> {
    conv_output(x, w, b, o.stride, o.padding, o.dilation, o.groups)
}

fn conv2d(
    x: &TensorIr,
    w: &TensorIr,
    b: Option<&TensorIr>,
    o: &Conv2dOptionsIr,
) -> Result<Shape, String> {
    conv_output(x, w, b, o.stride, o.padding, o.dilation, o.groups)
}

/// Checks that a gradient has the shape of the forward output.
fn gradient(grad: &TensorIr, forward: Shape) -> Result<(), String> {
    check(grad.shape == forward, || {
        format!(
            "a gradient of shape {} for an output of shape {}",
            shown(&grad.shape),
            shown(&forward)
        )
    })
}

/// A backward operation: `grad` has the forward output's shape, and the
/// result has `like`'s.
fn backward(grad: &TensorIr, forward: Result<Shape, String>, like: &TensorIr) -> Shapes {
    gradient(grad, forward?)?;
    same(like)
}

/// A convolution's bias gradient: one value per output channel.
fn bias_gradient(x: &TensorIr, bias: &TensorIr, grad: &TensorIr) -> Shapes {
    let g = &grad.shape;
    check(
        g.rank() == x.shape.rank()
            && g.rank() >= 2
            && g[0] == x.shape[0]
            && bias.shape.as_slice() == [g[1]],
        || {
            format!(
                "a bias gradient {} for bias {}",
                shown(g),
                shown(&bias.shape)
            )
        },
    )?;
    same(bias)
}

/// A pooling window: at least 1, strides at least 1, padding at most half
/// the window (as burn requires), fitting the padded input.
fn pool_output<const N: usize>(
    x: &TensorIr,
    kernel: [usize; N],
    stride: [usize; N],
    padding: [usize; N],
    dilation: [usize; N],
    ceil_mode: bool,
) -> Result<Shape, String> {
    let xs = &x.shape;
    check(xs.rank() == N + 2, || {
        format!("a {N}-D pooling of {}", shown(xs))
    })?;
    let mut out = xs.clone();
    for i in 0..N {
        let (k, s, p, d) = (kernel[i], stride[i], padding[i], dilation[i]);
        let padded = xs[i + 2].checked_add(p.saturating_mul(2));
        let reach = k
            .checked_sub(1)
            .and_then(|r| r.checked_mul(d))
            .and_then(|r| r.checked_add(1));
        match (padded, reach) {
            (Some(padded), Some(reach)) if s >= 1 && d >= 1 && p <= k / 2 && reach <= padded => {
                let span = padded - reach;
                let mut size = if ceil_mode {
                    span.div_ceil(s)
                } else {
                    span / s
                } + 1;
                // As PyTorch and burn-flex: a last window that would start
                // in the trailing padding is dropped.
                if ceil_mode && (size - 1) * s >= xs[i + 2] + p {
                    size -= 1;
                }
                out[i + 2] = size;
            }
            _ => {
                return Err(format!(
                    "a pooling window {kernel:?} (stride {stride:?}, padding {padding:?}, \
                     dilation {dilation:?}) for an input of {}",
                    shown(xs)
                ));
            }
        }
    }
    Ok(out)
}

fn module(op: &ModuleOperationIr) -> Shapes {
    use ModuleOperationIr as M;
    match op {
        M::Linear(op) => {
            check(
                op.weight.shape.rank() == 2 && last_dim(&op.x)? == op.weight.shape[0],
                || {
                    format!(
                        "a linear layer of weights {} on {}",
                        shown(&op.weight.shape),
                        shown(&op.x.shape)
                    )
                },
            )?;
            let outputs = op.weight.shape[1];
            if let Some(bias) = &op.bias {
                check(bias.shape.as_slice() == [outputs], || {
                    format!(
                        "a bias of shape {} for {outputs} outputs",
                        shown(&bias.shape)
                    )
                })?;
            }
            one(with_dim(&op.x.shape, op.x.shape.rank() - 1, outputs))
        }
        M::LinearXBackward(op) => {
            check(
                op.weight.shape.rank() == 2 && last_dim(&op.output_grad)? == op.weight.shape[1],
                || "a linear layer's gradient does not fit its weights".into(),
            )?;
            let rank = op.output_grad.shape.rank();
            one(with_dim(
                &op.output_grad.shape,
                rank - 1,
                op.weight.shape[0],
            ))
        }
        M::LinearWeightBackward(op) => {
            let (x, g) = (&op.x.shape, &op.output_grad.shape);
            check(
                x.rank() == g.rank() && x.rank() >= 1 && x[..x.rank() - 1] == g[..g.rank() - 1],
                || {
                    format!(
                        "a linear layer's gradient {} for input {}",
                        shown(g),
                        shown(x)
                    )
                },
            )?;
            one([last_dim(&op.x)?, last_dim(&op.output_grad)?].into())
        }
        M::LinearBiasBackward(op) => one([last_dim(&op.output_grad)?].into()),
        M::Conv1d(op) => one(conv1d(&op.x, &op.weight, op.bias.as_ref(), &op.options)?),
        M::Conv1dXBackward(op) => backward(
            &op.output_grad,
            conv1d(&op.x, &op.weight, None, &op.options),
            &op.x,
        ),
        M::Conv1dWeightBackward(op) => backward(
            &op.output_grad,
            conv1d(&op.x, &op.weight, None, &op.options),
            &op.weight,
        ),
        M::Conv2d(op) => one(conv2d(&op.x, &op.weight, op.bias.as_ref(), &op.options)?),
        M::Conv2dXBackward(op) => backward(
            &op.output_grad,
            conv2d(&op.x, &op.weight, None, &op.options),
            &op.x,
        ),
        M::Conv2dWeightBackward(op) => backward(
            &op.output_grad,
            conv2d(&op.x, &op.weight, None, &op.options),
            &op.weight,
        ),
        M::Conv1dBiasBackward(op) => bias_gradient(&op.x, &op.bias, &op.output_grad),
        M::Conv2dBiasBackward(op) => bias_gradient(&op.x, &op.bias, &op.output_grad),
        M::MaxPool2d(op) => one(pool_output(
            &op.x,
            op.kernel_size,
            op.stride,
            op.padding,
            op.dilation,
            op.ceil_mode,
        )?),
        M::MaxPool2dWithIndices(op) => {
            let out = pool_output(
                &op.x,
                op.kernel_size,
                op.stride,
                op.padding,
                op.dilation,
                op.ceil_mode,
            )?;
            Ok(vec![out.clone(), out])
        }
        M::MaxPool2dWithIndicesBackward(op) => {
            let out = pool_output(
                &op.x,
                op.kernel_size,
                op.stride,
                op.padding,
                op.dilation,
                op.ceil_mode,
            )?;
            check(op.indices.shape == out, || {
                "max pooling's indices do not fit".into()
            })?;
            backward(&op.grad, Ok(out), &op.x)
        }
        M::AvgPool2d(op) => one(pool_output(
            &op.x,
            op.kernel_size,
            op.stride,
            op.padding,
            [1, 1],
            op.ceil_mode,
        )?),
        M::AvgPool2dBackward(op) => backward(
            &op.grad,
            pool_output(
                &op.x,
                op.kernel_size,
                op.stride,
                op.padding,
                [1, 1],
                op.ceil_mode,
            ),
            &op.x,
        ),
        M::AdaptiveAvgPool2d(op) => {
            let xs = &op.x.shape;
            check(
                xs.rank() == 4 && op.output_size.iter().all(|&s| s >= 1),
                || {
                    format!(
                        "an adaptive pooling of {} to {:?}",
                        shown(xs),
                        op.output_size
                    )
                },
            )?;
            one([xs[0], xs[1], op.output_size[0], op.output_size[1]].into())
        }
        M::AdaptiveAvgPool2dBackward(op) => {
            let (xs, gs) = (&op.x.shape, &op.grad.shape);
            check(
                xs.rank() == 4 && gs.rank() == 4 && xs[..2] == gs[..2],
                || {
                    format!(
                        "an adaptive pooling gradient {} for {}",
                        shown(gs),
                        shown(xs)
                    )
                },
            )?;
            same(&op.x)
        }
        M::Embedding(op) => {
            check(op.weights.shape.rank() == 2, || {
                "embedding weights must be 2-D".into()
            })?;
            let mut shape = op.indices.shape.clone();
            shape.push(op.weights.shape[1]);
            one(shape)
        }
        M::EmbeddingBackward(op) => {
            let mut expected = op.indices.shape.clone();
            check(op.weights.shape.rank() == 2, || {
                "embedding weights must be 2-D".into()
            })?;
            expected.push(op.weights.shape[1]);
            gradient(&op.out_grad, expected)?;
            same(&op.weights)
        }
        other => unsupported(&name(&OperationIr::Module(other.clone()))),
    }
}
