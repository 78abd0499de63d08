//! A session as bytes, for the host's snapshots of a trial: its tensors,
//! and where its random generator stands.
//!
//! burn's backends keep their generators in private globals (burn-flex's,
//! and for the GPU the host-side generator that seeds cubecl's kernels),
//! so their state cannot be read out. It is a function of the last seed and of the draws since,
//! though, so the session records those ([`Draws`]): a restored session
//! seeds the generator again and draws the same tensors again (thrown
//! away), which leaves it exactly where the snapshot's stood. Draws of the
//! same kind in a row are kept as one run with a count. So that the record
//! and the replay stay small, once the record reaches [`MAX_DRAW_RUNS`]
//! runs or [`MAX_REPLAY_ELEMENTS`] elements the session seeds the
//! generator itself, with a seed derived from the last one, and starts a
//! new record: a restored session does the same at the same draw, so the
//! two stay identical (burn in the guest would draw other numbers from
//! there on; for the CNN example, after about a thousand epochs).
//!
//! A session that never seeded draws from the system's entropy, and a
//! restored one does so afresh: nothing is recorded or replayed.

use burn_backend::Backend;
use burn_ir::{
    FloatOperationIr, NumericOperationIr, OperationIr, TensorId, TensorIr, TensorStatus,
};
use burn_std::reader::read_sync;
use burn_std::{DType, Distribution, Shape, TensorData};
use serde::{Deserialize, Serialize};

use super::{Session, guarded};
use crate::ledger::{Id, bytes_of};
use crate::storage::Buffers;

/// Most runs of draws a session records between seeds.
pub const MAX_DRAW_RUNS: usize = 1 << 16;

/// Most elements a restore draws again: a second or two of the worker's
/// time. Each draw counts as at least [`ELEMENTS_PER_DRAW`].
pub const MAX_REPLAY_ELEMENTS: u64 = 1 << 28;

/// What a draw counts for at least, whatever its size: replaying one is a
/// call into the backend, about as long as drawing this many elements.
/// Without it, draws of no elements (or one) cost a restore a call each
/// and the record nothing, so a guest could make its own restores run past
/// the host's wait.
const ELEMENTS_PER_DRAW: u64 = 1 << 10;

/// One random tensor drawn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Draw {
    /// An integer tensor (else a float one).
    int: bool,
    shape: Shape,
    distribution: Distribution,
    dtype: DType,
}

impl Draw {
    /// The draw `op` makes, if it is a random one.
    pub(super) fn of(op: &OperationIr) -> Option<Self> {
        let (int, desc) = match op {
            OperationIr::Float(_, FloatOperationIr::Random(desc)) => (false, desc),
            OperationIr::NumericInt(_, NumericOperationIr::IntRandom(desc)) => (true, desc),
            _ => return None,
        };
        Some(Self {
            int,
            shape: desc.out.shape.clone(),
            distribution: desc.distribution,
            dtype: desc.out.dtype,
        })
    }

    fn elements(&self) -> u64 {
        self.shape
            .iter()
            .fold(1u64, |n, &d| n.saturating_mul(d as u64))
    }

    /// What it counts for against [`MAX_REPLAY_ELEMENTS`].
    fn replay_cost(&self) -> u64 {
        self.elements().max(ELEMENTS_PER_DRAW)
    }

    /// Draws it again from the backend's generator, as the interpreter did.
    fn replay<B: Backend>(&self, device: &B::Device) {
        let shape = self.shape.clone();
        if self.int {
            drop(B::int_random(
                shape,
                self.distribution,
                device,
                self.dtype.into(),
            ));
        } else {
            drop(B::float_random(
                shape,
                self.distribution,
                device,
                self.dtype.into(),
            ));
        }
    }
}

/// The last seed and the draws since, as runs of equal draws.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Draws {
    seed: Option<u64>,
    runs: Vec<(Draw, u64)>,
    /// Elements drawn since the seed.
    elements: u64,
}

impl Draws {
    /// The generator was seeded: earlier draws no longer matter.
    pub(super) fn seeded(&mut self, seed: u64) {
        *self = Self {
            seed: Some(seed),
            ..Self::default()
        };
    }

    /// `draw` is about to be drawn: when recording it would pass the
    /// record's bounds, seeds the generator from the last seed and starts a
    /// new record, which the draw then begins.
    pub(super) fn before<B: Backend>(&mut self, draw: &Draw, device: &B::Device) {
        let Some(seed) = self.seed else { return };
        let joins = self.runs.last().is_some_and(|(last, _)| last == draw);
        let runs_full = !joins && self.runs.len() >= MAX_DRAW_RUNS;
        let elements_full = self.elements.saturating_add(draw.replay_cost()) > MAX_REPLAY_ELEMENTS;
        if runs_full || elements_full {
            let next = next_seed(seed);
            B::seed(device, next);
            self.seeded(next);
        }
    }

    /// Records `draw`, drawn after [`Draws::before`].
    pub(super) fn push(&mut self, draw: Draw) {
        if self.seed.is_none() {
            return;
        }
        self.elements = self.elements.saturating_add(draw.replay_cost());
        match self.runs.last_mut() {
            Some((last, count)) if *last == draw => *count += 1,
            _ => self.runs.push((draw, 1)),
        }
    }

    /// Checks a record from a snapshot file against the bounds a session
    /// keeps to, and the trial's `quota`.
    fn check(&self, quota: u64) -> Result<(), String> {
        if self.runs.len() > MAX_DRAW_RUNS {
            return Err(format!("{} runs of random draws", self.runs.len()));
        }
        let mut elements = 0u64;
        for (draw, count) in &self.runs {
            let bytes = bytes_of(&draw.shape, draw.dtype)?;
            if bytes > quota {
                return Err(format!(
                    "a random draw of {bytes} bytes, over the trial's quota of {quota}"
                ));
            }
            elements = draw
                .replay_cost()
                .checked_mul(*count)
                .and_then(|n| n.checked_add(elements))
                .filter(|&n| n <= MAX_REPLAY_ELEMENTS)
                .ok_or_else(|| {
                    format!("more than the {MAX_REPLAY_ELEMENTS} random elements a restore draws")
                })?;
        }
        if self.seed.is_none() && !self.runs.is_empty() {
            return Err("random draws recorded without a seed".into());
        }
        Ok(())
    }

    /// Seeds the backend's generator again and draws everything again.
    fn replay<B: Backend>(&self, device: &B::Device) {
        let Some(seed) = self.seed else { return };
        B::seed(device, seed);
        for (draw, count) in &self.runs {
            for _ in 0..*count {
                draw.replay::<B>(device);
            }
        }
    }
}

/// The seed a session moves on to from `seed` (SplitMix64's step): any
/// function of the seed alone would do, as long as a restored session
/// computes the same one.
fn next_seed(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What a snapshot holds of a session.
#[derive(Serialize, Deserialize)]
struct Image {
    /// `(id, data)` of every tensor, by ascending id.
    tensors: Vec<(u64, TensorData)>,
    draws: Draws,
}

impl<B: Buffers> Session<B> {
    /// The session as bytes: its tensors' data and its random generator's
    /// record. Charges no fuel: the host takes snapshots, not the guest. A
    /// failed session has no exact state to give.
    pub fn image(&mut self) -> Result<Vec<u8>, String> {
        self.spoiled()?;
        let held: Vec<TensorIr> = self
            .ledger
            .entries()
            .into_iter()
            .map(|(id, entry)| TensorIr {
                id,
                shape: entry.shape.clone(),
                status: TensorStatus::ReadOnly,
                dtype: entry.dtype,
            })
            .collect();
        let mut tensors = Vec::with_capacity(held.len());
        for tensor in held {
            let id = tensor.id;
            let interpreter = &mut self.interpreter;
            let data = guarded(|| read_sync(interpreter.read_tensor_async(tensor)))
                .and_then(|read| read.map_err(|e| format!("reading {}: {e}", Id(id))))
                .map_err(|why| self.refuse(format!("taking a snapshot: {why}")))?;
            tensors.push((id.value(), data));
        }
        let image = Image {
            tensors,
            draws: self.draws.clone(),
        };
        Ok(postcard::to_allocvec(&image).expect("encoding into a Vec cannot fail"))
    }

    /// Takes over a snapshot's session from [`Session::image`]: its tensors,
    /// counted against this session's quota, and its random generator's
    /// state. This session must be fresh. Charges no fuel.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), String> {
        let restored = self.take_over(bytes);
        restored.map_err(|why| self.refuse(format!("restoring a snapshot: {why}")))
    }

    fn take_over(&mut self, bytes: &[u8]) -> Result<(), String> {
        if self.commands > 0 || !self.ledger.is_empty() || self.error.is_some() {
            return Err("the session has run commands already".into());
        }
        let image: Image =
            postcard::from_bytes(bytes).map_err(|e| format!("its data does not decode: {e}"))?;
        // The image passed these checks when it was made, under the same
        // quota; a file changed since may not.
        for (id, data) in image.tensors {
            let id = TensorId::new(id);
            let bytes = self.check_data(id, &data)?;
            self.admit(id, data, bytes)?;
        }
        image.draws.check(self.ledger.quota())?;
        let device = &self.device;
        guarded(|| image.draws.replay::<B>(device))?;
        self.draws = image.draws;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::{Flex, FlexDevice};

    fn one_element() -> Draw {
        Draw {
            int: false,
            shape: Shape::from(vec![1]),
            distribution: Distribution::Default,
            dtype: DType::F32,
        }
    }

    /// A draw of one element costs a restore a backend call all the same:
    /// counted as [`ELEMENTS_PER_DRAW`], a long series of them starts a new
    /// record before a restore would spend more than its bound replaying.
    #[test]
    fn tiny_draws_count_against_the_replay_bound() {
        let mut draws = Draws::default();
        draws.seeded(5);
        let draw = one_element();
        let most = MAX_REPLAY_ELEMENTS / ELEMENTS_PER_DRAW;
        for _ in 0..most + 10 {
            draws.before::<Flex>(&draw, &FlexDevice);
            draws.push(draw.clone());
        }
        let recorded: u64 = draws.runs.iter().map(|(_, count)| count).sum();
        assert_eq!(recorded, 10, "the record started over at the bound");
        assert!(draws.check(1 << 20).is_ok());

        // A record from a file that passes the bound is refused.
        let mut forged = Draws::default();
        forged.seeded(5);
        forged.runs.push((draw, most + 1));
        let error = forged.check(1 << 20).unwrap_err();
        assert!(error.contains("random elements a restore draws"), "{error}");
    }
}
