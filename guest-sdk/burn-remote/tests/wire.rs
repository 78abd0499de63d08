//! Frames decode to the commands pushed, and a damaged frame is refused
//! with where it broke.

use burn_ir::{OperationIr, TensorId, TensorIr, TensorStatus};
use burn_remote::wire::{Command, Frame, commands};
use burn_std::{DType, Shape, TensorData};
use serde::Serialize;

fn sample() -> Vec<Command> {
    let data = TensorData::new(vec![1.5f32, -2.0, 0.25, 8.0, 0.0, -0.0], [2, 3]);
    let tensor = TensorIr {
        id: TensorId::new(1),
        shape: Shape::new([2, 3]),
        status: TensorStatus::ReadWrite,
        dtype: DType::F32,
    };
    vec![
        Command::Seed(u64::MAX),
        Command::Data {
            id: TensorId::new(1),
            data,
        },
        Command::Operation(OperationIr::Drop(tensor)),
    ]
}

#[test]
fn a_frame_gives_back_its_commands_in_order() {
    let mut frame = Frame::new();
    for command in sample() {
        frame.push(&command);
    }
    assert_eq!(frame.len(), 3);
    let decoded: Vec<Command> = commands(frame.bytes()).collect::<Result<_, _>>().unwrap();
    assert_eq!(decoded, sample());
    frame.clear();
    assert!(frame.is_empty() && frame.bytes().is_empty());
    assert_eq!(commands(frame.bytes()).count(), 0);
}

#[test]
fn a_damaged_frame_is_refused_where_it_breaks() {
    let mut frame = Frame::new();
    for command in sample() {
        frame.push(&command);
    }
    let whole = frame.bytes();
    let first = {
        let mut one = Frame::new();
        one.push(&sample()[0]);
        one.bytes().len()
    };
    // Cut inside the data command: the seed decodes, then the error.
    let cut = &whole[..first + 5];
    let decoded: Vec<_> = commands(cut).collect();
    assert_eq!(decoded.len(), 2);
    assert_eq!(decoded[0], Ok(Command::Seed(u64::MAX)));
    let error = decoded[1].clone().unwrap_err();
    assert!(
        error.starts_with(&format!(
            "command 1 of the frame (byte {first}) does not decode"
        )),
        "{error}"
    );

    // A variant no command has.
    let error = commands(&[200]).next().unwrap().unwrap_err();
    assert!(
        error.starts_with("command 0 of the frame (byte 0)"),
        "{error}"
    );
}

/// [`Command::Data`] as the wire has it, with any shape for its values.
#[derive(Serialize)]
enum Forged {
    _Operation,
    Data {
        id: TensorId,
        data: (Vec<u8>, Vec<usize>, DType),
    },
}

fn forged(shape: &[usize]) -> Vec<u8> {
    let values: Vec<u8> = [1.5f32; 6].iter().flat_map(|v| v.to_le_bytes()).collect();
    let data = (values, shape.to_vec(), DType::F32);
    postcard::to_stdvec(&Forged::Data {
        id: TensorId::new(9),
        data,
    })
    .unwrap()
}

#[test]
fn data_whose_bytes_do_not_fit_its_shape_is_refused() {
    // The forgery is faithful: with the shape its values fit, it decodes.
    let fits = commands(&forged(&[2, 3])).next().unwrap().unwrap();
    let expected = TensorData::new(vec![1.5f32; 6], [2, 3]);
    assert_eq!(
        fits,
        Command::Data {
            id: TensorId::new(9),
            data: expected
        }
    );
    for shape in [&[3, 3][..], &[usize::MAX, 2], &[]] {
        let error = commands(&forged(shape)).next().unwrap().unwrap_err();
        assert!(error.contains("does not decode"), "{shape:?}: {error}");
    }
}
