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
//! worker runs unconfined. A worker on a GPU gets a looser filter
//! ([`confine_gpu`]), since the Vulkan driver needs much of what the CPU
//! worker's forbids.

/// Runs burn's matmul once, so that it learns the machine while it may
/// still look: the CPU kernels read the caches' sizes from
/// `/sys/devices/system/cpu` the first time they multiply, which the filter
/// would forbid. Call before [`confine`].
pub fn warm_up() -> Result<(), String> {
    once::<burn_flex::Flex>(burn_flex::FlexDevice, 256, true)
}

/// What the CPU worker may take beside its tensors' quota: the executable,
/// its stack and the allocator's arena.
const CPU_BASE: u64 = 1 << 30;

/// The CPU worker's cap on its private writable memory (`RLIMIT_DATA`)
/// for a session of `memory_bytes`: four times that (the scratch a kernel
/// takes and the copies it makes of its inputs, which the ledger bounds by
/// a small multiple of the quota, and a frame and its decoded copy) plus
/// [`CPU_BASE`].
pub fn data_limit(memory_bytes: u64) -> u64 {
    memory_bytes.saturating_mul(4).saturating_add(CPU_BASE)
}

/// Caps the worker's private writable memory at [`data_limit`]: a
/// backstop under the ledger for what it does not model. Past it an
/// allocation fails and the worker dies, ending only its trial, rather
/// than pressing on the machine's memory. Not for a GPU worker, whose
/// driver maps device memory into the process. Set by the worker itself,
/// so that wtune starts it without a hook between fork and exec.
pub fn limit_data(memory_bytes: u64) -> Result<(), String> {
    let bytes = libc::rlim_t::try_from(data_limit(memory_bytes)).unwrap_or(libc::RLIM_INFINITY);
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit only reads the struct passed.
    match unsafe { libc::setrlimit(libc::RLIMIT_DATA, &limit) } {
        0 => Ok(()),
        _ => Err(format!(
            "setting its data limit: {}",
            std::io::Error::last_os_error()
        )),
    }
}

/// [`warm_up`] on a GPU: one addition, so that the driver has loaded its
/// shader compiler and started its threads before [`confine_gpu`], and a
/// device that cannot run a kernel fails here, with the reason. Not a
/// matmul: autotuning it compiles several kernels, seconds on software
/// Vulkan.
pub fn warm_up_gpu(device: crate::gpu::Device) -> Result<(), String> {
    once::<crate::gpu::Gpu>(device, 8, false)
}

/// Squares (`multiply`) or doubles an `n` x `n` matrix of ones on `device`.
fn once<B: crate::storage::Buffers>(
    device: B::Device,
    n: usize,
    multiply: bool,
) -> Result<(), String> {
    use burn_ir::{
        BinaryOpIr, FloatOperationIr, MatmulOpIr, NumericOperationIr, OperationIr, TensorId,
        TensorIr, TensorStatus,
    };
    use burn_remote::wire::{Command, Frame};
    use burn_std::{DType, Shape, TensorData};

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
    let (lhs, rhs, out) = (
        tensor(1, TensorStatus::ReadOnly),
        tensor(1, TensorStatus::ReadWrite),
        tensor(2, TensorStatus::NotInit),
    );
    frame.push(&Command::Operation(if multiply {
        OperationIr::Float(
            DType::F32,
            FloatOperationIr::Matmul(MatmulOpIr { lhs, rhs, out }),
        )
    } else {
        OperationIr::NumericFloat(
            DType::F32,
            NumericOperationIr::Add(BinaryOpIr { lhs, rhs, out }),
        )
    }));
    let mut session = crate::Session::<B>::on(device, 1 << 20, u64::MAX);
    session
        .read(frame.bytes(), tensor(2, TensorStatus::ReadWrite))
        .map(drop)
}

/// Installs the filter for this process. Call before reading any input.
#[cfg(target_os = "linux")]
pub fn confine() -> Result<(), String> {
    use filter::{Action, Op, Rules, install, when};

    let no_exec = || when(2, Op::MaskedEq(libc::PROT_EXEC as u64), 0);
    let mut rules = Rules::new();
    rules.insert(libc::SYS_read, vec![when(0, Op::Eq, 0)?]);
    rules.insert(
        libc::SYS_write,
        vec![when(0, Op::Eq, 1)?, when(0, Op::Eq, 2)?],
    );
    // abort() (an allocation that fails) raises SIGABRT at itself.
    let me = u64::from(std::process::id());
    rules.insert(libc::SYS_tgkill, vec![when(0, Op::Eq, me)?]);
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
    // burn-flex starts no threads: this one is the worker.
    install(rules, Action::KillProcess, Action::Allow, false)
}

/// Elsewhere the worker runs unconfined.
#[cfg(not(target_os = "linux"))]
pub fn confine() -> Result<(), String> {
    Ok(())
}

/// Installs the filter of a worker on a GPU, on every thread. Call once
/// the device is open and [`warm_up_gpu`] has run.
///
/// The Vulkan driver cannot be given [`confine`]'s list: it opens device
/// files, issues `ioctl`s and maps memory executable for its shader
/// compiler whenever a kernel is first used. So this filter is a list of
/// what is refused instead (with `EPERM`, so that a driver that asks gets
/// an error, not a dead worker): starting a process or program, the
/// network, signals to other processes and their limits, tracing or
/// reading them, and the kernel's namespace, mount, BPF and key
/// interfaces. Files stay open to the worker, as they are to the host
/// compute GPU worker (see SECURITY.md): what a process of the user
/// running wtune may write, it may (`/proc/<pid>/mem` of another
/// included where the kernel allows it that).
#[cfg(target_os = "linux")]
pub fn confine_gpu() -> Result<(), String> {
    use filter::{Action, Op, Rules, install, when};

    let mut refused = Rules::new();
    // A new thread is allowed, a new process is not.
    refused.insert(
        libc::SYS_clone,
        vec![when(0, Op::MaskedEq(libc::CLONE_THREAD as u64), 0)?],
    );
    #[cfg(target_arch = "x86_64")]
    for call in [libc::SYS_fork, libc::SYS_vfork] {
        refused.insert(call, Vec::new());
    }
    // Signals only to itself (abort, and the threads of the driver).
    let me = u64::from(std::process::id());
    refused.insert(libc::SYS_tgkill, vec![when(0, Op::Ne, me)?]);
    for call in [
        libc::SYS_kill,
        libc::SYS_tkill,
        libc::SYS_rt_sigqueueinfo,
        libc::SYS_rt_tgsigqueueinfo,
        libc::SYS_pidfd_send_signal,
        libc::SYS_prlimit64,
        libc::SYS_execve,
        libc::SYS_execveat,
        libc::SYS_socket,
        libc::SYS_socketpair,
        libc::SYS_connect,
        libc::SYS_bind,
        libc::SYS_listen,
        libc::SYS_accept,
        libc::SYS_accept4,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_open,
        libc::SYS_pidfd_getfd,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_chroot,
        libc::SYS_pivot_root,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_userfaultfd,
        libc::SYS_io_uring_setup,
    ] {
        refused.insert(call, Vec::new());
    }
    // The same calls by their x32 numbers, which a filter for x86-64
    // would otherwise let through where the kernel offers x32.
    #[cfg(target_arch = "x86_64")]
    {
        const X32: i64 = 0x4000_0000;
        let x32: Vec<_> = refused.iter().map(|(&n, r)| (n | X32, r.clone())).collect();
        refused.extend(x32);
    }
    // The driver and cubecl have started threads by now.
    let eperm = Action::Errno(libc::EPERM as u32);
    install(refused, Action::Allow, eperm, true)?;
    // clone3's flags sit in memory a filter cannot read: refused as
    // unknown, the C library falls back to clone, which is checked above.
    let unknown = Action::Errno(libc::ENOSYS as u32);
    let clone3 = Rules::from([(libc::SYS_clone3, Vec::new())]);
    install(clone3, Action::Allow, unknown, true)
}

/// Elsewhere the worker runs unconfined.
#[cfg(not(target_os = "linux"))]
pub fn confine_gpu() -> Result<(), String> {
    Ok(())
}

/// The two filters' shared parts, over seccompiler.
#[cfg(target_os = "linux")]
mod filter {
    use std::collections::BTreeMap;

    use seccompiler::{
        BpfProgram, SeccompCmpArgLen, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
    };
    pub use seccompiler::{SeccompAction as Action, SeccompCmpOp as Op};

    /// System calls and the rules under which a filter matches them (none:
    /// always).
    pub type Rules = BTreeMap<i64, Vec<SeccompRule>>;

    /// A rule that holds when argument `arg` compares with `value` by `op`.
    pub fn when(arg: u8, op: Op, value: u64) -> Result<SeccompRule, String> {
        SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)
            .and_then(|c| SeccompRule::new(vec![c]))
            .map_err(|e| e.to_string())
    }

    /// Installs a filter that takes `matched` for the calls `rules` match
    /// and `mismatch` for every other, on this thread or on `every_thread`
    /// of the process.
    pub fn install(
        rules: Rules,
        mismatch: Action,
        matched: Action,
        every_thread: bool,
    ) -> Result<(), String> {
        let arch = TargetArch::try_from(std::env::consts::ARCH)
            .map_err(|e| format!("no system call filter for this machine: {e}"))?;
        let filter = SeccompFilter::new(rules, mismatch, matched, arch)
            .map_err(|e| format!("building the system call filter: {e}"))?;
        let program: BpfProgram = filter
            .try_into()
            .map_err(|e| format!("compiling the system call filter: {e}"))?;
        let installed = match every_thread {
            true => seccompiler::apply_filter_all_threads(&program),
            false => seccompiler::apply_filter(&program),
        };
        installed.map_err(|e| format!("installing the system call filter: {e}"))
    }
}
