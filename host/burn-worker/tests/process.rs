//! The `wtune-burn-worker` executable, driven over its pipes as wtune
//! drives it.

use std::io::{BufReader, Write};
use std::process::{Child, Command as Process, Stdio};

use burn_ir::{NumericOperationIr, OperationIr, TensorId, TensorIr, TensorStatus, UnaryOpIr};
use burn_remote::wire::{Command, Frame};
use burn_std::{DType, Shape, TensorData};
use wtune_burn_worker::Usage;
use wtune_burn_worker::protocol::{Kind, Reply, Request};

const WORKER: &str = env!("CARGO_BIN_EXE_wtune-burn-worker");

fn tensor(id: u64, status: TensorStatus) -> TensorIr {
    TensorIr {
        id: TensorId::new(id),
        shape: Shape::from(vec![2, 2]),
        status,
        dtype: DType::F32,
    }
}

fn request(kind: Kind, commands: &[Command], tensor: Option<TensorIr>) -> Request {
    let mut frame = Frame::new();
    for command in commands {
        frame.push(command);
    }
    Request {
        kind,
        fuel: 1 << 40,
        frame: frame.bytes().to_vec(),
        tensor: tensor
            .map(|t| postcard::to_allocvec(&t).unwrap())
            .unwrap_or_default(),
    }
}

/// A worker serving a session of `memory` bytes, its stdio piped.
fn spawn(memory: u64) -> Child {
    Process::new(WORKER)
        .args(["--memory-bytes", &memory.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the worker starts")
}

#[test]
fn the_worker_runs_frames_and_answers_reads_and_syncs_in_order() {
    let mut worker = spawn(1 << 20);
    let mut input = worker.stdin.take().unwrap();
    let mut output = BufReader::new(worker.stdout.take().unwrap());

    let data = Command::Data {
        id: TensorId::new(1),
        data: TensorData::new(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]),
    };
    let neg = Command::Operation(OperationIr::NumericFloat(
        DType::F32,
        NumericOperationIr::Neg(UnaryOpIr {
            input: tensor(1, TensorStatus::ReadWrite),
            out: tensor(2, TensorStatus::NotInit),
        }),
    ));
    // A submit gets no reply; the read after it carries the rest.
    request(Kind::Submit, &[data], None)
        .write(&mut input)
        .unwrap();
    let read = request(Kind::Read, &[neg], Some(tensor(2, TensorStatus::ReadOnly)));
    read.write(&mut input).unwrap();
    input.flush().unwrap();
    let reply = Reply::read(&mut output).expect("the read's reply");
    let values: TensorData = postcard::from_bytes(&reply.outcome.expect("the data")).unwrap();
    assert_eq!(
        values.try_to_vec::<f32>().unwrap(),
        vec![-1.0, -2.0, -3.0, -4.0]
    );
    // The data (16 bytes: 101 fuel), the negation (100 + 2 + 4) and the
    // read (101); tensor 1 was freed at its last use.
    assert_eq!(reply.fuel_spent, 101 + 106 + 101);
    assert_eq!(
        reply.usage,
        Usage {
            bytes: 16,
            tensors: 1
        }
    );

    // A sync that fails says why, and so does every request after it.
    let bad = request(Kind::Sync, &[], None);
    let mut bad_frame = bad.clone();
    bad_frame.frame = vec![0xff, 0xff];
    bad_frame.write(&mut input).unwrap();
    input.flush().unwrap();
    let reply = Reply::read(&mut output).unwrap();
    let error = reply.outcome.expect_err("a damaged frame");
    assert!(
        error.starts_with("burn command 3: command 0 of the frame"),
        "{error}"
    );
    bad.write(&mut input).unwrap();
    input.flush().unwrap();
    assert_eq!(Reply::read(&mut output).unwrap().outcome, Err(error));

    drop(input);
    let status = worker.wait().unwrap();
    assert!(
        status.success(),
        "the worker ends when wtune closes its input: {status}"
    );
}

#[test]
fn the_worker_refuses_to_start_without_its_quota() {
    let out = Process::new(WORKER).output().expect("the worker runs");
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("usage: wtune-burn-worker --memory-bytes N"),
        "{said}"
    );
    let out = Process::new(WORKER)
        .args(["--memory-bytes", "lots"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("--memory-bytes takes a number of bytes, not \"lots\""),
        "{said}"
    );
}

#[test]
fn a_request_of_no_known_kind_ends_the_worker_with_the_reason() {
    let mut worker = spawn(1 << 20);
    let mut input = worker.stdin.take().unwrap();
    input.write_all(&[9; 25]).unwrap();
    drop(input);
    let out = worker.wait_with_output().unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("wtune-burn-worker: request kind 9"), "{said}");
}

#[cfg(target_os = "linux")]
#[test]
fn the_worker_is_killed_by_its_filter_when_it_opens_a_file() {
    use std::os::unix::process::ExitStatusExt;
    let out = Process::new(WORKER)
        .arg("--check-confinement")
        .output()
        .expect("the worker runs");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSYS),
        "{}; it said: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_confined_worker_runs_the_kernels_a_cnn_needs() {
    use burn_ir::{Conv2dOpIr, Conv2dOptionsIr, FloatOperationIr, MatmulOpIr, ModuleOperationIr};
    let mut worker = spawn(16 << 20);
    let mut input = worker.stdin.take().unwrap();
    let mut output = BufReader::new(worker.stdout.take().unwrap());
    let of = |id: u64, shape: &[usize], status| TensorIr {
        id: TensorId::new(id),
        shape: Shape::from(shape.to_vec()),
        status,
        dtype: DType::F32,
    };
    let ones = |id: u64, shape: &[usize]| Command::Data {
        id: TensorId::new(id),
        data: TensorData::new(vec![1.0f32; shape.iter().product()], shape.to_vec()),
    };
    let (read_only, fresh) = (TensorStatus::ReadOnly, TensorStatus::NotInit);
    // Large enough for the blocked matmul kernels, which may ask the
    // system about the machine's threads.
    let matmul = Command::Operation(OperationIr::Float(
        DType::F32,
        FloatOperationIr::Matmul(MatmulOpIr {
            lhs: of(1, &[256, 256], read_only),
            rhs: of(1, &[256, 256], read_only),
            out: of(2, &[256, 256], fresh),
        }),
    ));
    let conv = Command::Operation(OperationIr::Module(ModuleOperationIr::Conv2d(Conv2dOpIr {
        x: of(3, &[4, 2, 8, 8], read_only),
        weight: of(4, &[3, 2, 3, 3], read_only),
        bias: None,
        options: Conv2dOptionsIr {
            stride: [1, 1],
            padding: [(0, 0), (0, 0)],
            dilation: [1, 1],
            groups: 1,
        },
        out: of(5, &[4, 3, 6, 6], fresh),
    })));
    let commands = [
        ones(1, &[256, 256]),
        matmul,
        ones(3, &[4, 2, 8, 8]),
        ones(4, &[3, 2, 3, 3]),
        conv,
    ];
    let mut read = |id: u64, shape: &[usize], commands: &[Command]| {
        request(Kind::Read, commands, Some(of(id, shape, read_only)))
            .write(&mut input)
            .unwrap();
        input.flush().unwrap();
        let reply = Reply::read(&mut output).expect("a reply: the worker was not killed");
        let data: TensorData = postcard::from_bytes(&reply.outcome.expect("the data")).unwrap();
        data.try_to_vec::<f32>().unwrap()
    };
    assert!(read(2, &[256, 256], &commands).iter().all(|&v| v == 256.0));
    // Each output sums a 3x3 window over 2 channels of ones.
    assert!(read(5, &[4, 3, 6, 6], &[]).iter().all(|&v| v == 18.0));
    drop(input);
    assert!(worker.wait().unwrap().success());
}

/// The CPU worker caps its own private writable memory once started: a
/// backstop under the ledger, so that memory it does not model ends the
/// trial's worker rather than pressing on the machine.
#[cfg(target_os = "linux")]
#[test]
fn the_cpu_worker_caps_its_data_at_four_times_its_quota_and_a_base() {
    let mut worker = spawn(64 << 20);
    let mut input = worker.stdin.take().unwrap();
    let mut output = BufReader::new(worker.stdout.take().unwrap());
    // A reply means it is past its start, limit set.
    request(Kind::Sync, &[], None).write(&mut input).unwrap();
    input.flush().unwrap();
    assert_eq!(Reply::read(&mut output).unwrap().outcome, Ok(Vec::new()));
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", worker.id())).unwrap();
    let data = limits
        .lines()
        .find(|line| line.starts_with("Max data size"))
        .unwrap();
    let expected = wtune_burn_worker::confine::data_limit(64 << 20);
    assert_eq!(expected, (256 << 20) + (1 << 30));
    let values: Vec<&str> = data.split_whitespace().skip(3).take(2).collect();
    assert_eq!(
        values,
        [expected.to_string(), expected.to_string()],
        "{data}"
    );
    drop(input);
    assert!(worker.wait().unwrap().success());
}
