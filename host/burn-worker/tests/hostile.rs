//! A hostile guest's burn commands get errors, never a crash: tensors it
//! does not hold, shapes that lie or overflow, gigantic allocations, use
//! after free, operations the host does not run, and more work than its
//! fuel pays for. Each test forges the frames a guest could send.

mod common;

use burn_ir::{
    BaseOperationIr, Conv1dOptionsIr, Conv1dWeightBackwardOpIr, Conv2dOpIr, Conv2dOptionsIr,
    CreationOpIr, FlipOpIr, FloatOperationIr, GatherOpIr, MatmulOpIr, MaxPool2dOpIr,
    ModuleOperationIr, NumericOperationIr, OperationIr, PadModeIr, PadOpIr, PermuteOpIr, ScalarIr,
    ScatterNdOpIr, SelectOpIr, ShapeOpIr, SliceOpIr, TensorId, TensorIr, TensorStatus, UnaryOpIr,
};
use burn_remote::wire::Command;
use burn_std::{DType, IndexingUpdateOp, TensorData};
use common::{frame, tensor};
use wtune_burn_worker::{Session, Usage, cost};

const QUOTA: u64 = 1 << 20;

fn session() -> Session {
    Session::new(QUOTA, u64::MAX)
}

fn input(id: u64, shape: &[usize]) -> TensorIr {
    tensor(id, shape, TensorStatus::ReadOnly)
}

fn last_use(id: u64, shape: &[usize]) -> TensorIr {
    tensor(id, shape, TensorStatus::ReadWrite)
}

fn output(id: u64, shape: &[usize]) -> TensorIr {
    tensor(id, shape, TensorStatus::NotInit)
}

/// Tensor data the guest sends: `shape` filled with 1, 2, 3, ...
fn data(id: u64, shape: &[usize]) -> Command {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (1..=n).map(|v| v as f32).collect();
    Command::Data {
        id: TensorId::new(id),
        data: TensorData::new(values, shape.to_vec()),
    }
}

fn neg(input: TensorIr, out: TensorIr) -> Command {
    Command::Operation(OperationIr::NumericFloat(
        DType::F32,
        NumericOperationIr::Neg(UnaryOpIr { input, out }),
    ))
}

fn matmul(lhs: TensorIr, rhs: TensorIr, out: TensorIr) -> Command {
    Command::Operation(OperationIr::Float(
        DType::F32,
        FloatOperationIr::Matmul(MatmulOpIr { lhs, rhs, out }),
    ))
}

fn zeros(out: TensorIr) -> Command {
    Command::Operation(OperationIr::BaseFloat(BaseOperationIr::Zeros(
        CreationOpIr { out },
    )))
}

/// Runs `commands` in a fresh session and returns the error, checking that
/// it is also what a read and a sync answer, and that the session holds
/// what `held` says it held before the bad command.
fn refused(setup: Vec<Command>, bad: Command) -> String {
    let mut session = session();
    session.run(&frame(setup));
    assert_eq!(session.error(), None, "the setup runs");
    let held = session.usage();
    session.run(&frame([bad, data(999, &[1])]));
    let error = session.error().expect("the command is refused").to_owned();
    assert_eq!(session.usage(), held, "a refused command changes nothing");
    assert_eq!(
        session.sync(&[]),
        Err(error.clone()),
        "a sync answers with it"
    );
    let read = session.read(&[], input(999, &[1]));
    assert_eq!(read, Err(error.clone()), "the command after it did not run");
    error
}

#[test]
fn a_tensor_the_trial_never_made_is_refused() {
    let error = refused(vec![], neg(input(7, &[2]), output(8, &[2])));
    assert_eq!(
        error,
        "burn command 1: NumericFloat(Neg) was refused: tensor 7 is not one of this \
         trial's tensors (never made, or already freed)"
    );
}

#[test]
fn a_tensor_used_after_its_last_use_is_refused() {
    let error = refused(
        vec![data(1, &[2]), neg(last_use(1, &[2]), output(2, &[2]))],
        neg(input(1, &[2]), output(3, &[2])),
    );
    assert!(
        error.contains("tensor 1 is not one of this trial's tensors"),
        "{error}"
    );
    let error = refused(
        vec![data(1, &[2, 2])],
        matmul(last_use(1, &[2, 2]), input(1, &[2, 2]), output(2, &[2, 2])),
    );
    assert!(
        error.ends_with("tensor 1 is used after the use that frees it"),
        "{error}"
    );
}

#[test]
fn an_id_in_use_is_not_made_again() {
    let error = refused(vec![data(1, &[2])], data(1, &[3]));
    assert!(error.ends_with("tensor 1 already exists"), "{error}");
    let error = refused(
        vec![data(1, &[2]), data(2, &[2])],
        neg(input(1, &[2]), output(2, &[2])),
    );
    assert!(error.ends_with("tensor 2 already exists"), "{error}");
}

#[test]
fn a_tensor_described_with_another_shape_is_refused() {
    let error = refused(
        vec![data(1, &[2, 3])],
        neg(input(1, &[3, 2]), output(2, &[3, 2])),
    );
    assert!(
        error.ends_with("tensor 1 is [2, 3] F32, and the operation says [3, 2] F32"),
        "{error}"
    );
}

#[test]
fn outputs_must_have_the_shapes_their_inputs_make() {
    let setup = || vec![data(1, &[2, 3]), data(2, &[3, 4])];
    let error = refused(
        setup(),
        matmul(input(1, &[2, 3]), input(2, &[3, 4]), output(3, &[64, 64])),
    );
    assert!(
        error.ends_with("tensor 3 must be [2, 4], and was declared [64, 64]"),
        "{error}"
    );
    let error = refused(
        setup(),
        matmul(input(2, &[3, 4]), input(1, &[2, 3]), output(3, &[3, 3])),
    );
    assert!(error.ends_with("a matmul of [3, 4] by [2, 3]"), "{error}");
    let error = refused(setup(), neg(input(1, &[2, 3]), output(3, &[2, 3, 1000])));
    assert!(error.contains("must be [2, 3]"), "{error}");
}

#[test]
fn a_convolution_whose_channels_do_not_match_is_refused() {
    let options = Conv2dOptionsIr {
        stride: [1, 1],
        padding: [(1, 1), (1, 1)],
        dilation: [1, 1],
        groups: 1,
    };
    let conv = |x: &[usize], w: &[usize], out: &[usize], options: Conv2dOptionsIr| {
        Command::Operation(OperationIr::Module(ModuleOperationIr::Conv2d(Conv2dOpIr {
            x: input(1, x),
            weight: input(2, w),
            bias: None,
            options,
            out: output(3, out),
        })))
    };
    let setup = || vec![data(1, &[1, 2, 4, 4]), data(2, &[3, 2, 3, 3])];
    // The same convolution with the right channels runs.
    let mut session = session();
    session.run(&frame(setup()));
    session.run(&frame([conv(
        &[1, 2, 4, 4],
        &[3, 2, 3, 3],
        &[1, 3, 4, 4],
        options.clone(),
    )]));
    assert_eq!(session.error(), None);

    let setup = || vec![data(1, &[1, 2, 4, 4]), data(2, &[3, 5, 3, 3])];
    let error = refused(
        setup(),
        conv(&[1, 2, 4, 4], &[3, 5, 3, 3], &[1, 3, 4, 4], options.clone()),
    );
    assert!(
        error.contains("input channels 2 do not match weights [3, 5, 3, 3]"),
        "{error}"
    );
    let stride_zero = Conv2dOptionsIr {
        stride: [0, 1],
        ..options
    };
    let setup = || vec![data(1, &[1, 2, 4, 4]), data(2, &[3, 2, 3, 3])];
    let error = refused(
        setup(),
        conv(&[1, 2, 4, 4], &[3, 2, 3, 3], &[1, 3, 4, 4], stride_zero),
    );
    assert!(
        error.contains("stride, dilation and groups must be at least 1"),
        "{error}"
    );
}

/// A weight gradient is a convolution whose result spans as far as the
/// gradient reaches into the input, sliced to the weight's shape after:
/// with a stride far wider than the kernel, 64 MiB for a 4 KiB weight.
/// Counted before it runs, it is refused; a gradient whose stride skips a
/// little, as a downsampling layer's does, still runs.
#[test]
fn a_weight_gradient_that_reaches_past_its_kernel_counts_what_it_computes() {
    let weight_gradient = |x: &[usize], w: &[usize], grad: &[usize], stride: usize| {
        Command::Operation(OperationIr::Module(
            ModuleOperationIr::Conv1dWeightBackward(Conv1dWeightBackwardOpIr {
                x: input(1, x),
                weight: input(2, w),
                output_grad: input(3, grad),
                options: Conv1dOptionsIr {
                    stride: [stride],
                    padding: [(0, 0)],
                    dilation: [1],
                    groups: 1,
                },
                out: output(4, w),
            }),
        ))
    };
    let (x, w, grad) = (&[1, 1, 16384][..], &[1024, 1, 1][..], &[1, 1024, 1][..]);
    let error = refused(
        vec![data(1, x), data(2, w), data(3, grad)],
        weight_gradient(x, w, grad, 16384),
    );
    assert!(error.contains("over its quota"), "{error}");

    let (x, w, grad) = (&[1, 2, 8][..], &[3, 2, 1][..], &[1, 3, 4][..]);
    let mut session = session();
    session.run(&frame([data(1, x), data(2, w), data(3, grad)]));
    session.run(&frame([weight_gradient(x, w, grad, 2)]));
    assert_eq!(session.error(), None);
}

/// A convolution copies each tile of up to 512 output positions' input
/// windows (im2col) before it multiplies: with a 32 x 32 kernel over 8
/// channels, 16 MiB per thread, for 160 KiB of tensors. Counted before it
/// runs, it is refused under a 1 MiB quota.
#[test]
fn a_convolution_counts_the_input_windows_it_copies() {
    let options = Conv2dOptionsIr {
        stride: [1, 1],
        padding: [(0, 0), (0, 0)],
        dilation: [1, 1],
        groups: 1,
    };
    let (x, w, out) = (
        &[1, 8, 64, 64][..],
        &[1, 8, 32, 32][..],
        &[1, 1, 33, 33][..],
    );
    let conv = Command::Operation(OperationIr::Module(ModuleOperationIr::Conv2d(Conv2dOpIr {
        x: input(1, x),
        weight: input(2, w),
        bias: None,
        options,
        out: output(3, out),
    })));
    let error = refused(vec![data(1, x), data(2, w)], conv);
    assert!(error.contains("over its quota"), "{error}");

    // Padding that differs before and after is applied to a copy of the
    // input: a one-element input padded as wide as a dilated 2 x 2 kernel
    // reaches (2001 x 2001, copied twice) for a one-element output.
    let options = Conv2dOptionsIr {
        stride: [2000, 2000],
        padding: [(1000, 999), (1000, 999)],
        dilation: [1000, 1000],
        groups: 1,
    };
    let (x, w, out) = (&[1, 1, 1, 1][..], &[1, 1, 2, 2][..], &[1, 1, 1, 1][..]);
    let conv = Command::Operation(OperationIr::Module(ModuleOperationIr::Conv2d(Conv2dOpIr {
        x: input(1, x),
        weight: input(2, w),
        bias: None,
        options,
        out: output(3, out),
    })));
    let error = refused(vec![data(1, x), data(2, w)], conv);
    assert!(error.contains("over its quota"), "{error}");
}

#[test]
fn shapes_that_overflow_and_gigantic_tensors_are_refused_before_any_allocation() {
    let huge = 1usize << 40;
    let error = refused(vec![], zeros(output(1, &[huge, huge, huge])));
    assert!(error.ends_with("overflows"), "{error}");
    let error = refused(vec![], zeros(output(1, &[1 << 20, 1 << 20])));
    assert!(
        error.contains("would take 4398046511104 bytes, over its quota of 1048576"),
        "{error}"
    );
    // Data counts against the quota too.
    let error = refused(vec![data(1, &[200, 1000])], data(2, &[200, 1000]));
    assert!(error.contains("over its quota"), "{error}");
    // And outputs while their inputs are still held: [512, 1] x [1, 512]
    // makes 1 MiB from 4 KiB.
    let error = refused(
        vec![data(1, &[512, 1]), data(2, &[1, 512])],
        matmul(
            input(1, &[512, 1]),
            input(2, &[1, 512]),
            output(3, &[512, 512]),
        ),
    );
    assert!(error.contains("over its quota"), "{error}");
}

#[test]
fn operations_the_host_does_not_run_are_named() {
    let scatter = Command::Operation(OperationIr::BaseFloat(BaseOperationIr::ScatterNd(
        ScatterNdOpIr {
            data: input(1, &[4]),
            indices: input(1, &[4]),
            values: input(1, &[4]),
            reduction: IndexingUpdateOp::Assign,
            out: output(2, &[4]),
        },
    )));
    let error = refused(vec![data(1, &[4])], scatter);
    assert!(
        error.starts_with(
            "burn command 2: BaseFloat(ScatterNd) was refused: scatter_nd is not \
             among the operations the host runs yet"
        ),
        "{error}"
    );
}

#[test]
fn fuel_is_charged_by_the_work_before_it_runs() {
    let mut session = session();
    session.run(&frame([data(1, &[8, 16]), data(2, &[16, 4])]));
    let data_fuel = cost::data_fuel(8 * 16 * 4) + cost::data_fuel(16 * 4 * 4);
    assert_eq!(session.take_fuel_spent(), data_fuel);
    let op = matmul(input(1, &[8, 16]), input(2, &[16, 4]), output(3, &[8, 4]));
    // 100 per operation, 2 per multiply-add, a fuel per 16 bytes in and out.
    let matmul_fuel = 100 + 2 * 8 * 4 * 16 + (8 * 16 + 16 * 4 + 8 * 4) * 4 / 16;
    session.grant(matmul_fuel - 1);
    session.run(&frame([op.clone()]));
    let error = session.error().expect("one short of the fuel is refused");
    assert!(
        error.ends_with(&format!(
            "out of fuel: it costs {matmul_fuel} and the trial has {} left",
            matmul_fuel - 1
        )),
        "{error}"
    );
    assert_eq!(session.usage().tensors, 2, "the matmul did not run");
    assert_eq!(session.take_fuel_spent(), 0);

    let mut session = self::session();
    session.run(&frame([data(1, &[8, 16]), data(2, &[16, 4])]));
    session.take_fuel_spent();
    session.grant(matmul_fuel);
    session.run(&frame([op]));
    assert_eq!(session.error(), None);
    assert_eq!(session.take_fuel_spent(), matmul_fuel);
}

#[test]
fn fuel_spent_but_not_yet_counted_by_the_host_is_still_owed() {
    let mut session = session();
    session.grant(1_000);
    session.run(&frame([data(1, &[4])]));
    let spent = cost::data_fuel(16);
    // The host has not seen the charge yet: granting 1,000 again leaves
    // 1,000 less what was spent.
    session.grant(1_000);
    // 4 bytes a value, 16 bytes a fuel: this costs 100 + (901 - spent),
    // one more than is left.
    let values = 4 * (901 - spent as usize);
    assert_eq!(cost::data_fuel(4 * values as u64), 1_000 - spent + 1);
    session.run(&frame([data(2, &[values])]));
    let error = session.error().expect("refused");
    assert!(
        error.ends_with(&format!("the trial has {} left", 1_000 - spent)),
        "{error}"
    );
}

#[test]
fn reads_give_back_the_data_and_free_at_the_last_use() {
    let mut session = session();
    session.run(&frame([
        data(1, &[2, 2]),
        neg(input(1, &[2, 2]), output(2, &[2, 2])),
    ]));
    assert_eq!(
        session.usage(),
        Usage {
            bytes: 32,
            tensors: 2
        }
    );
    let read = session.read(&[], last_use(2, &[2, 2])).expect("the read");
    assert_eq!(
        read.try_to_vec::<f32>().unwrap(),
        vec![-1.0, -2.0, -3.0, -4.0]
    );
    assert_eq!(
        session.usage(),
        Usage {
            bytes: 16,
            tensors: 1
        }
    );
    let error = session
        .read(&[], input(2, &[2, 2]))
        .expect_err("read after free");
    assert!(
        error.contains("tensor 2 is not one of this trial's tensors"),
        "{error}"
    );
}

#[test]
fn a_damaged_frame_stops_the_session_where_it_breaks() {
    let mut session = session();
    let mut bytes = frame([data(1, &[2])]);
    bytes.extend_from_slice(&[0xff; 3]);
    session.run(&bytes);
    let error = session.error().expect("refused");
    assert!(
        error.starts_with("burn command 2: command 1 of the frame"),
        "{error}"
    );
    assert_eq!(session.usage().tensors, 1, "the command before it ran");
}

#[test]
fn a_drop_frees_the_tensor_and_its_quota() {
    let mut session = session();
    session.run(&frame([
        data(1, &[100]),
        Command::Operation(OperationIr::Drop(last_use(1, &[100]))),
    ]));
    assert_eq!(session.error(), None);
    assert_eq!(session.usage(), Usage::default());
}

#[test]
fn an_index_out_of_range_stops_the_session_not_the_worker() {
    let indices = TensorIr {
        dtype: DType::I64,
        ..input(2, &[2])
    };
    let select = Command::Operation(OperationIr::BaseFloat(BaseOperationIr::Select(
        SelectOpIr {
            tensor: input(1, &[4]),
            dim: 0,
            indices,
            out: output(3, &[2]),
        },
    )));
    let setup = vec![
        data(1, &[4]),
        Command::Data {
            id: TensorId::new(2),
            data: TensorData::new(vec![0i64, 10], [2]),
        },
    ];
    // burn checks the index (its values are data the host cannot check
    // ahead) and panics; the session turns that into the trial's error.
    let error = refused(setup, select);
    assert!(error.contains("the backend stopped: "), "{error}");
    assert!(error.contains("10"), "{error}");
}

/// Off the gathered dimension an index's position is the tensor's: the
/// GPU's gather reads there unchecked, so a wider index tensor is refused
/// by its shape, not left to the backend.
#[test]
fn a_gather_whose_indices_are_wider_than_the_tensor_is_refused() {
    let indices = TensorIr {
        dtype: DType::I64,
        ..input(2, &[3, 4])
    };
    let gather = base(BaseOperationIr::Gather(GatherOpIr {
        tensor: input(1, &[2, 2]),
        dim: 1,
        indices,
        out: output(3, &[3, 4]),
    }));
    let setup = vec![
        data(1, &[2, 2]),
        Command::Data {
            id: TensorId::new(2),
            data: TensorData::new(vec![0i64; 12], [3, 4]),
        },
    ];
    let error = refused(setup, gather);
    assert!(
        error.ends_with(
            "gather's indices [3, 4] must have the shape of the tensor [2, 2] but along \
             dimension 1"
        ),
        "{error}"
    );
}

fn base(op: BaseOperationIr) -> Command {
    Command::Operation(OperationIr::BaseFloat(op))
}

#[test]
fn a_flip_that_names_an_axis_twice_is_refused() {
    let flip = |axes: Vec<usize>| {
        base(BaseOperationIr::Flip(FlipOpIr {
            input: input(1, &[4, 4]),
            out: output(2, &[4, 4]),
            axes,
        }))
    };
    // Named twice, burn's view would start past the end of its buffer.
    let error = refused(vec![data(1, &[4, 4])], flip(vec![0, 0]));
    assert!(
        error.ends_with("flip axes [0, 0] are not distinct axes of 2 dimensions"),
        "{error}"
    );
    let mut session = session();
    session.run(&frame([data(1, &[4, 4]), flip(vec![1, 0])]));
    assert_eq!(session.error(), None);
}

#[test]
fn padding_is_one_pair_per_dimension_in_order() {
    let pad = |padding: Vec<(usize, usize)>, out: &[usize]| {
        Command::Operation(OperationIr::NumericFloat(
            DType::F32,
            NumericOperationIr::Pad(PadOpIr {
                input: input(1, &[1, 3]),
                out: output(2, out),
                padding,
                mode: PadModeIr::Constant(ScalarIr::Float(0.0)),
            }),
        ))
    };
    let mut session = session();
    session.run(&frame([
        data(1, &[1, 3]),
        pad(vec![(2, 0), (0, 1)], &[3, 4]),
    ]));
    assert_eq!(session.error(), None);
    let read = session.read(&[], input(2, &[3, 4])).unwrap();
    assert_eq!(read.shape().as_slice(), [3, 4]);
    // Checked as the first dimension's padding, never the last's.
    let error = refused(vec![data(1, &[1, 3])], pad(vec![(2, 0), (0, 0)], &[1, 5]));
    assert!(
        error.ends_with("tensor 2 must be [3, 3], and was declared [1, 5]"),
        "{error}"
    );
    let error = refused(vec![data(1, &[1, 3])], pad(vec![(0, 1)], &[1, 4]));
    assert!(
        error.ends_with("1 paddings for a tensor of 2 dimensions"),
        "{error}"
    );
}

#[test]
fn a_slice_is_charged_for_the_buffer_it_keeps() {
    let mut session = session();
    let slice = base(BaseOperationIr::Slice(SliceOpIr {
        tensor: last_use(1, &[1000]),
        ranges: vec![burn_std::Slice::new(0, Some(1), 1)],
        out: output(2, &[1]),
    }));
    session.run(&frame([data(1, &[1000]), slice]));
    assert_eq!(session.error(), None);
    // The tensor is freed, and its buffer lives on in the slice.
    assert_eq!(
        session.usage(),
        Usage {
            bytes: 4000,
            tensors: 1
        }
    );
    // A view of the slice, the slice freed, keeps the same buffer: it is
    // charged for it too, not for its own one element.
    let permute = base(BaseOperationIr::Permute(PermuteOpIr {
        input: last_use(2, &[1]),
        out: output(3, &[1]),
        axes: vec![0],
    }));
    let reshape = base(BaseOperationIr::Reshape(ShapeOpIr {
        input: last_use(3, &[1]),
        out: output(4, &[1, 1]),
    }));
    session.run(&frame([permute, reshape]));
    assert_eq!(session.error(), None);
    assert_eq!(
        session.usage(),
        Usage {
            bytes: 4000,
            tensors: 1
        }
    );
}

fn drop(tensor: TensorIr) -> Command {
    Command::Operation(OperationIr::Drop(tensor))
}

fn held(bytes: u64, tensors: u64) -> Usage {
    Usage { bytes, tensors }
}

#[test]
fn a_view_of_a_live_tensor_adds_only_its_own_elements() {
    let mut session = session();
    let slice = base(BaseOperationIr::Slice(SliceOpIr {
        tensor: input(1, &[1000]),
        ranges: vec![burn_std::Slice::new(0, Some(10), 1)],
        out: output(2, &[10]),
    }));
    session.run(&frame([data(1, &[1000]), slice]));
    assert_eq!(session.error(), None);
    // One buffer of 4000 bytes, and a snapshot of both tensors holds
    // 4000 + 40: the slice is not charged its input's buffer again.
    assert_eq!(session.usage(), held(4040, 2));
    // A reshape shares the buffer too, and a snapshot holds it whole.
    let reshape = base(BaseOperationIr::Reshape(ShapeOpIr {
        input: input(1, &[1000]),
        out: output(3, &[10, 100]),
    }));
    session.run(&frame([reshape]));
    assert_eq!(session.error(), None);
    assert_eq!(session.usage(), held(8040, 3));
    // Freeing the views gives back what they showed; the buffer stays
    // charged whole while any tensor holds it.
    session.run(&frame([
        drop(last_use(3, &[10, 100])),
        drop(last_use(1, &[1000])),
    ]));
    assert_eq!(session.error(), None);
    assert_eq!(session.usage(), held(4000, 1));
    session.run(&frame([drop(last_use(2, &[10]))]));
    assert_eq!(session.error(), None);
    assert_eq!(session.usage(), Usage::default());
}

#[test]
fn a_copy_made_by_a_layout_change_is_charged_as_its_own_buffer() {
    let mut session = session();
    let permute = base(BaseOperationIr::Permute(PermuteOpIr {
        input: input(1, &[10, 100]),
        out: output(2, &[100, 10]),
        axes: vec![1, 0],
    }));
    // The permuted tensor is not contiguous: burn copies to reshape it.
    let reshape = base(BaseOperationIr::Reshape(ShapeOpIr {
        input: last_use(2, &[100, 10]),
        out: output(3, &[1000]),
    }));
    let keep_copied = base(BaseOperationIr::Slice(SliceOpIr {
        tensor: last_use(3, &[1000]),
        ranges: vec![burn_std::Slice::new(0, Some(1), 1)],
        out: output(4, &[1]),
    }));
    session.run(&frame([data(1, &[10, 100]), permute, reshape, keep_copied]));
    assert_eq!(session.error(), None);
    assert_eq!(session.usage(), held(8000, 2));
    // One element of each buffer, kept: both stay charged whole.
    let keep_first = base(BaseOperationIr::Slice(SliceOpIr {
        tensor: last_use(1, &[10, 100]),
        ranges: vec![burn_std::Slice::new(0, Some(1), 1); 2],
        out: output(5, &[1, 1]),
    }));
    session.run(&frame([keep_first]));
    assert_eq!(session.error(), None);
    assert_eq!(session.usage(), held(8000, 2));
    let read = session.read(&[], last_use(4, &[1])).unwrap();
    assert_eq!(read.try_to_vec::<f32>().unwrap(), [1.0]);
    assert_eq!(session.usage(), held(4000, 1));
}

#[test]
fn views_cannot_hold_more_than_the_quota() {
    // 160,000 f32 values take 640 KB of the 1 MiB quota; a reshape of them
    // shares the buffer but a snapshot would hold both, so it is refused.
    let reshape = base(BaseOperationIr::Reshape(ShapeOpIr {
        input: input(1, &[160_000]),
        out: output(2, &[400, 400]),
    }));
    let error = refused(vec![data(1, &[160_000])], reshape);
    assert!(error.contains("over its quota"), "{error}");
}

#[test]
fn convolution_padding_wider_than_the_kernel_is_refused() {
    let conv = Command::Operation(OperationIr::Module(ModuleOperationIr::Conv2d(Conv2dOpIr {
        x: input(1, &[1, 1, 4, 4]),
        weight: input(2, &[1, 1, 1, 1]),
        bias: None,
        options: Conv2dOptionsIr {
            stride: [1000, 1000],
            padding: [(0, 2000), (0, 2000)],
            dilation: [1, 1],
            groups: 1,
        },
        out: output(3, &[1, 1, 3, 3]),
    })));
    let error = refused(vec![data(1, &[1, 1, 4, 4]), data(2, &[1, 1, 1, 1])], conv);
    assert!(
        error.contains("each side less than the kernel's reach"),
        "{error}"
    );
}

#[test]
fn an_output_type_lie_cannot_take_burn_past_the_quota() {
    // 160,000 f32 values (640 KB) held; an Exp of them declared as 1-byte
    // bools would fit the quota, and burn would make 640 KB more of f32.
    let exp = Command::Operation(OperationIr::Float(
        DType::F32,
        FloatOperationIr::Exp(UnaryOpIr {
            input: input(1, &[160_000]),
            out: TensorIr {
                dtype: DType::Bool(burn_std::BoolStore::Native),
                ..output(2, &[160_000])
            },
        }),
    ));
    let error = refused(vec![data(1, &[160_000])], exp);
    assert!(error.contains("over its quota"), "{error}");
}

#[test]
fn an_error_in_a_read_is_kept_like_any_other() {
    let mut session = session();
    let error = session.read(&[], input(5, &[1])).unwrap_err();
    assert!(
        error.starts_with("reading: tensor 5 is not one of"),
        "{error}"
    );
    assert_eq!(session.sync(&[]), Err(error));
}

#[test]
fn ceil_mode_pooling_drops_a_window_that_starts_in_the_padding() {
    let pool = |out: &[usize]| {
        Command::Operation(OperationIr::Module(ModuleOperationIr::MaxPool2d(
            MaxPool2dOpIr {
                x: input(1, &[1, 1, 5, 5]),
                kernel_size: [3, 3],
                stride: [3, 3],
                padding: [1, 1],
                dilation: [1, 1],
                ceil_mode: true,
                out: output(2, out),
            },
        )))
    };
    // (5 + 2 - 3) / 3 rounded up is 2, plus 1; the third window would
    // start at 6, in the padding, so there are 2, as PyTorch and burn say.
    let mut session = session();
    session.run(&frame([data(1, &[1, 1, 5, 5]), pool(&[1, 1, 2, 2])]));
    assert_eq!(session.error(), None);
    let error = refused(vec![data(1, &[1, 1, 5, 5])], pool(&[1, 1, 3, 3]));
    assert!(error.contains("must be [1, 1, 2, 2]"), "{error}");
}
