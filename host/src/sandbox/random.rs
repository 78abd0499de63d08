//! `wasi:random`, metered.
//!
//! wasmtime-wasi makes random bytes on the host, one generator draw per
//! byte, for calls the guest makes at no fuel cost of its own. Here the
//! trial's generators (both the secure and the insecure one) count what
//! they draw, and the store charges that as host work at every return to
//! the guest ([`super::store_data::TrialHost::charge_output`]), as it does
//! for output; one call may ask for at most [`MAX_RANDOM_BYTES`].
//!
//! Not covered: `insecure-seed`, a constant per trial that costs no draw.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rand_core::TryRng;
use wasmtime_wasi::{Rng, WasiCtxBuilder};

/// Most bytes one `get-random-bytes` (or `get-insecure-random-bytes`) call
/// may ask for; more traps, naming this limit. Guests seed their own
/// generators with a few bytes; wasmtime-wasi's default (64 MiB) would let
/// one call fill the guest's whole memory through the host.
pub(crate) const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// The bytes a trial's generators drew since the store last charged them.
#[derive(Debug, Clone, Default)]
pub(crate) struct RandomMeter(Arc<AtomicU64>);

impl RandomMeter {
    /// Gives `wasi` metered generators (fresh from the operating system's
    /// entropy, as wasmtime-wasi's own) and the per-call cap.
    pub(crate) fn install(&self, wasi: &mut WasiCtxBuilder) {
        wasi.secure_random(self.metered())
            .insecure_random(self.metered())
            .max_random_size(MAX_RANDOM_BYTES);
    }

    fn metered(&self) -> Metered {
        Metered {
            inner: wasmtime_wasi::thread_rng(),
            meter: self.clone(),
        }
    }

    /// The bytes drawn since the last call, for the store to charge.
    pub(crate) fn take(&self) -> u64 {
        self.0.swap(0, Ordering::Relaxed)
    }

    fn drew(&self, bytes: usize) {
        self.0.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// A generator that notes every byte it makes in its meter. wasmtime-wasi
/// draws a `u32` for each byte a guest asks for, so a byte costs four.
struct Metered {
    inner: Box<dyn Rng + Send>,
    meter: RandomMeter,
}

impl TryRng for Metered {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        self.meter.drew(4);
        Ok(self.inner.next_u32())
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        self.meter.drew(8);
        Ok(self.inner.next_u64())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.meter.drew(dst.len());
        self.inner.fill_bytes(dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_draw_is_counted_once_and_taken_once() {
        let meter = RandomMeter::default();
        let mut rng = meter.metered();
        rng.next_u32();
        rng.next_u64();
        let mut buf = [0u8; 100];
        rng.fill_bytes(&mut buf);
        assert!(buf.iter().any(|&b| b != 0), "the generator made bytes");
        assert_eq!(meter.take(), 4 + 8 + 100);
        assert_eq!(meter.take(), 0);
    }
}
