//! Keeping wasmtime's trap handlers in place in a process shared with other
//! libraries.
//!
//! wasmtime turns a guest's `unreachable`, out-of-bounds access or division
//! by zero into a trap through process-wide signal handlers (SIGSEGV,
//! SIGILL, SIGFPE, SIGBUS) that it installs with the first engine. A library
//! that installs its own handlers later (Ray's failure signal handler at
//! `ray.init`, Python's `faulthandler.enable()`) does not know wasm code: the
//! guest's next trap then ends the whole process instead of the trial.
//! Disabling signal-based traps is no way out, since that also turns off
//! the Spectre mitigations of bounds checks. The sandbox records wasmtime's
//! handlers right after its first engine is made, and
//! [`reinstate_trap_handlers`] puts them back; embedders that share their
//! process (the Python package) call it before entering a guest. A fault
//! outside wasm then goes to whatever handler wasmtime found when it was
//! installed, not to the later library's.

#[cfg(unix)]
mod unix {
    use std::sync::OnceLock;

    /// The signals wasmtime handles on Unix.
    const SIGNALS: [libc::c_int; 4] = [libc::SIGSEGV, libc::SIGILL, libc::SIGFPE, libc::SIGBUS];

    struct Recorded([(libc::c_int, libc::sigaction); 4]);

    // SAFETY: `sigaction` is plain data (function addresses, flags, a mask).
    unsafe impl Send for Recorded {}
    unsafe impl Sync for Recorded {}

    static RECORDED: OnceLock<Recorded> = OnceLock::new();

    fn current(signal: libc::c_int) -> libc::sigaction {
        // SAFETY: a zeroed sigaction is a valid out-parameter, and reading
        // the current action changes nothing.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            libc::sigaction(signal, std::ptr::null(), &mut action);
            action
        }
    }

    pub(crate) fn record() {
        RECORDED.get_or_init(|| Recorded(SIGNALS.map(|signal| (signal, current(signal)))));
    }

    pub fn reinstate() -> usize {
        let Some(Recorded(recorded)) = RECORDED.get() else {
            return 0;
        };
        let mut reinstated = 0;
        for (signal, action) in recorded {
            if current(*signal).sa_sigaction != action.sa_sigaction {
                // SAFETY: `action` is the action this process had installed
                // for `signal` (wasmtime's handler, which stays loaded for
                // the life of the process).
                if unsafe { libc::sigaction(*signal, action, std::ptr::null_mut()) } == 0 {
                    reinstated += 1;
                }
            }
        }
        reinstated
    }
}

/// Records the trap handlers wasmtime installed; the first call counts.
/// Called right after the sandbox's engine is made.
pub(crate) fn record_trap_handlers() {
    #[cfg(unix)]
    unix::record();
}

/// Puts wasmtime's trap handlers back where another library replaced them
/// since the first [`Sandbox`](super::Sandbox) was made; returns how many
/// were replaced. Cheap (one `sigaction` read per signal) when nothing
/// changed. Does nothing before the first sandbox, or off Unix.
pub fn reinstate_trap_handlers() -> usize {
    #[cfg(unix)]
    return unix::reinstate();
    #[cfg(not(unix))]
    0
}
