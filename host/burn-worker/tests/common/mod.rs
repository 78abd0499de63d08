//! What the worker's tests forge commands with, and read results by.

// Each test file uses its part.
#![allow(dead_code)]

use burn_ir::{FloatOperationIr, OperationIr, RandomOpIr};
use burn_ir::{TensorId, TensorIr, TensorStatus};
use burn_remote::wire::{Command, Frame};
use burn_std::{DType, Distribution, Shape, TensorData};
use wtune_burn_worker::Session;
use wtune_burn_worker::storage::Buffers;

/// An f32 tensor `id` of `shape`, as a command names it.
pub fn tensor(id: u64, shape: &[usize], status: TensorStatus) -> TensorIr {
    TensorIr {
        id: TensorId::new(id),
        shape: Shape::from(shape.to_vec()),
        status,
        dtype: DType::F32,
    }
}

/// `commands`, encoded as a guest's frame.
pub fn frame(commands: impl IntoIterator<Item = Command>) -> Vec<u8> {
    let mut frame = Frame::new();
    for command in commands {
        frame.push(&command);
    }
    frame.bytes().to_vec()
}

/// Tensor `id` of `values`, sent as data.
pub fn data(id: u64, values: Vec<f32>) -> Command {
    let n = values.len();
    Command::Data {
        id: TensorId::new(id),
        data: TensorData::new(values, [n]),
    }
}

/// Tensor `id` of `n` numbers drawn from `distribution`.
pub fn random(id: u64, n: usize, distribution: Distribution) -> Command {
    Command::Operation(OperationIr::Float(
        DType::F32,
        FloatOperationIr::Random(RandomOpIr {
            out: tensor(id, &[n], TensorStatus::NotInit),
            distribution,
        }),
    ))
}

/// The `n` numbers of tensor `id`, which `session` must read.
pub fn values<B: Buffers>(session: &mut Session<B>, id: u64, n: usize) -> Vec<f32> {
    let data = session
        .read(&[], tensor(id, &[n], TensorStatus::ReadOnly))
        .expect("the read");
    data.try_to_vec::<f32>().unwrap()
}
