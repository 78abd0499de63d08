//! The worker's own sandbox: before it reads a guest's first frame, the
//! worker gives up every system call that running burn's CPU kernels on
//! its pipes does not need.
//!
//! The checks in [`crate::shapes`] keep burn's kernels to inputs they are
//! written for, but those kernels are large and partly unchecked code fed
//! by a hostile guest. Should one still be made to misbehave, the process
//! it runs in can read its requests (fd 0), write its replies and errors
//! (fds 1 and 2), allocate and release memory that is never executable,
//! wait on its locks, read the clock and random bytes, signal itself (an
//! abort) and exit;
//! anything else (opening a file, a socket, starting a process, mapping
//! executable memory) kills it with `SIGSYS`, and wtune reports the
//! trial's worker as died. Linux only (x86-64 and aarch64); elsewhere the
//! worker runs unconfined.

/// Runs burn's matmul once, so that it learns the machine while it may
/// still look: the CPU kernels read the caches' sizes from
/// `/sys/devices/system/cpu` the first time they multiply, which the filter
/// would forbid. Call before [`confine`].
pub fn warm_up() -> Result<(), String> {
    use burn_ir::{FloatOperationIr, MatmulOpIr, OperationIr, TensorId, TensorIr, TensorStatus};
    use burn_remote::wire::{Command, Frame};
    use burn_std::{DType, Shape, TensorData};

    let n = 256;
    let tensor = |id, status| TensorIr {
        id: TensorId::new(id),
        shape: Shape::from(vec![n, n]),
        status,
        dtype: DType::F32,
    };
    let mut frame = Frame::new();
    frame.push(&Command::Data {
        id: TensorId::new(1),
        data: TensorData::new(vec![1.0f32; n * n], [n, n]),
    });
    frame.push(&Command::Operation(OperationIr::Float(
        DType::F32,
        FloatOperationIr::Matmul(MatmulOpIr {
            lhs: tensor(1, TensorStatus::ReadOnly),
            rhs: tensor(1, TensorStatus::ReadWrite),
            out: tensor(2, TensorStatus::NotInit),
        }),
    )));
    let mut session = crate::Session::new(1 << 20, u64::MAX);
    session
        .read(frame.bytes(), tensor(2, TensorStatus::ReadWrite))
        .map(drop)
}

/// Installs the filter for this process. Call before reading any input.
#[cfg(target_os = "linux")]
pub fn confine() -> Result<(), String> {
    use std::collections::BTreeMap;

    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };

    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("no system call filter for this machine: {e}"))?;
    let when = |arg: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)
            .and_then(|c| SeccompRule::new(vec![c]))
            .map_err(|e| e.to_string())
    };
    let no_exec = || when(2, SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64), 0);
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    rules.insert(libc::SYS_read, vec![when(0, SeccompCmpOp::Eq, 0)?]);
    rules.insert(
        libc::SYS_write,
        vec![when(0, SeccompCmpOp::Eq, 1)?, when(0, SeccompCmpOp::Eq, 2)?],
    );
    // abort() (an allocation that fails) raises SIGABRT at itself.
    let me = u64::from(std::process::id());
    rules.insert(libc::SYS_tgkill, vec![when(0, SeccompCmpOp::Eq, me)?]);
    rules.insert(libc::SYS_mmap, vec![no_exec()?]);
    rules.insert(libc::SYS_mprotect, vec![no_exec()?]);
    // Unconditional: memory, waiting on locks, signals' returns, the
    // clock and randomness burn's unseeded generator may ask for, exit.
    for call in [
        libc::SYS_munmap,
        libc::SYS_mremap,
        libc::SYS_brk,
        libc::SYS_madvise,
        libc::SYS_futex,
        libc::SYS_sched_yield,
        libc::SYS_sched_getaffinity,
        libc::SYS_rt_sigreturn,
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigaction,
        libc::SYS_sigaltstack,
        libc::SYS_clock_gettime,
        libc::SYS_getrandom,
        libc::SYS_gettid,
        libc::SYS_getpid,
        libc::SYS_close,
        libc::SYS_exit,
        libc::SYS_exit_group,
    ] {
        rules.insert(call, Vec::new());
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        arch,
    )
    .map_err(|e| format!("building the system call filter: {e}"))?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e| format!("compiling the system call filter: {e}"))?;
    seccompiler::apply_filter(&program)
        .map_err(|e| format!("installing the system call filter: {e}"))
}

/// Elsewhere the worker runs unconfined.
#[cfg(not(target_os = "linux"))]
pub fn confine() -> Result<(), String> {
    Ok(())
}
