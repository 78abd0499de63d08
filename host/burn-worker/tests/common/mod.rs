//! What the worker's tests forge commands with.

use burn_ir::{TensorId, TensorIr, TensorStatus};
use burn_remote::wire::{Command, Frame};
use burn_std::{DType, Shape};

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
