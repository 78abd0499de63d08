//! The trial's tensors as the worker knows them: which ids it holds, their
//! shapes and types, and the bytes they take against the trial's quota.
//!
//! The ledger is the worker's own account, kept beside burn-router's
//! interpreter: an operation is checked against it before the interpreter
//! sees the operation, so a guest cannot name a tensor it does not hold,
//! claim a shape a tensor does not have, or reuse an id.
//!
//! Its bytes are charged per buffer ([`storage`](crate::storage)): tensors
//! that share one (burn's views) are charged for it once, and a small view
//! of a freed tensor for the whole buffer it keeps. A buffer is charged at
//! least the bytes of its tensors, each counted whole, because that is what
//! a snapshot of them holds ([`Session::image`](crate::Session::image)):
//! a reshape of a tensor costs as much as a copy while both are held.

use std::collections::HashMap;
use std::fmt;

use burn_ir::{TensorId, TensorIr, TensorStatus};
use burn_std::{DType, Shape};

use crate::storage::Buffer;

/// Most dimensions a tensor may have: burn's models use up to 6.
pub const MAX_RANK: usize = 16;

/// Most tensors one trial holds at once. Each costs the worker memory the
/// byte account does not count (its entry here, burn's handle), so an
/// empty tensor is not free: this bounds that overhead to a few tens of
/// MiB. Models hold hundreds (a CNN with Adam: under 200).
pub const MAX_TENSORS: usize = 1 << 16;

/// What the ledger knows of one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub shape: Shape,
    pub dtype: DType,
    /// Its elements' bytes, all of them, however its buffer holds them.
    pub bytes: u64,
}

/// The tensors one trial holds on the host.
#[derive(Debug)]
pub struct Ledger {
    /// Each tensor, with the key of the buffer it holds.
    tensors: HashMap<TensorId, (Entry, usize)>,
    buffers: HashMap<usize, Held>,
    /// What the buffers are charged, together.
    bytes: u64,
    quota: u64,
}

/// A buffer the trial's tensors hold.
#[derive(Debug)]
struct Held {
    /// Its size.
    bytes: u64,
    /// Its tensors' bytes, each counted whole.
    shown: u64,
    /// How many tensors hold it.
    tensors: usize,
}

impl Held {
    fn charge(&self) -> u64 {
        self.bytes.max(self.shown)
    }
}

/// An operation's tensors, checked: what it reads, what it frees after
/// and what it makes.
#[derive(Debug, Default)]
pub struct Plan {
    /// Inputs marked as their last use: freed once the operation ran.
    pub frees: Vec<TensorId>,
    /// Outputs, with their sizes.
    pub makes: Vec<(TensorId, Entry)>,
}

impl Plan {
    /// Bytes the outputs take.
    pub fn bytes(&self) -> u64 {
        // Each output fits the quota, but a guest may declare several.
        self.makes
            .iter()
            .map(|(_, e)| e.bytes)
            .fold(0, u64::saturating_add)
    }
}

/// A tensor id, as errors show it.
pub struct Id(pub TensorId);

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // TensorId keeps its number private and shows it as `TensorId(7)`.
        let shown = self.0.to_string();
        let number = shown
            .strip_prefix("TensorId(")
            .and_then(|s| s.strip_suffix(')'))
            .unwrap_or(&shown);
        write!(f, "tensor {number}")
    }
}

/// A shape, as errors show it: `[16, 1, 8, 8]`.
pub fn shown(shape: &Shape) -> String {
    format!("{:?}", shape.as_slice())
}

/// Whether the host's backends hold `dtype`: every float, integer and
/// bool type, not quantized tensors. How bools are stored depends on the
/// backend, which the session checks.
pub fn supported(dtype: DType) -> bool {
    !matches!(dtype, DType::QFloat(_))
}

/// The bytes a tensor of `shape` and `dtype` takes, if that is a tensor
/// the host holds: a supported type, at most [`MAX_RANK`] dimensions and a
/// size that fits in 64 bits.
pub fn bytes_of(shape: &Shape, dtype: DType) -> Result<u64, String> {
    if !supported(dtype) {
        return Err(format!("{dtype:?} tensors are not supported on the host"));
    }
    if shape.rank() > MAX_RANK {
        return Err(format!(
            "a tensor of {} dimensions (at most {MAX_RANK})",
            shape.rank()
        ));
    }
    shape
        .iter()
        .try_fold(dtype.size() as u64, |bytes, &dim| {
            bytes.checked_mul(u64::try_from(dim).ok()?)
        })
        .ok_or_else(|| format!("a {dtype:?} tensor of shape {} overflows", shown(shape)))
}

impl Ledger {
    /// An empty ledger whose tensors may take `quota` bytes together.
    pub fn new(quota: u64) -> Self {
        Self {
            tensors: HashMap::new(),
            buffers: HashMap::new(),
            bytes: 0,
            quota,
        }
    }

    /// Bytes the trial's tensors take.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// How many tensors the trial holds.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The entry for `id`, if the trial holds it.
    pub fn get(&self, id: TensorId) -> Option<&Entry> {
        self.tensors.get(&id).map(|(entry, _)| entry)
    }

    /// Checks that `tensor` is one the trial holds, as the guest describes it.
    pub fn check_input(&self, tensor: &TensorIr) -> Result<&Entry, String> {
        let id = Id(tensor.id);
        if matches!(tensor.status, TensorStatus::NotInit) {
            return Err(format!("{id} is read before it was written"));
        }
        let entry = self.get(tensor.id).ok_or_else(|| {
            format!("{id} is not one of this trial's tensors (never made, or already freed)")
        })?;
        if entry.shape != tensor.shape || entry.dtype != tensor.dtype {
            return Err(format!(
                "{id} is {} {:?}, and the operation says {} {:?}",
                shown(&entry.shape),
                entry.dtype,
                shown(&tensor.shape),
                tensor.dtype
            ));
        }
        Ok(entry)
    }

    /// Checks an operation's tensors: each input is held and described as
    /// it is, none is freed twice, each output is a new id with a size the
    /// quota has room for.
    pub fn plan<'a>(
        &self,
        inputs: impl IntoIterator<Item = &'a TensorIr>,
        outputs: impl IntoIterator<Item = &'a TensorIr>,
    ) -> Result<Plan, String> {
        let mut plan = Plan::default();
        for input in inputs {
            self.check_input(input)?;
            // burn-router frees a tensor at its `ReadWrite` use: a later
            // use in the same operation would read a freed tensor.
            if plan.frees.contains(&input.id) {
                return Err(format!(
                    "{} is used after the use that frees it",
                    Id(input.id)
                ));
            }
            if matches!(input.status, TensorStatus::ReadWrite) {
                plan.frees.push(input.id);
            }
        }
        for output in outputs {
            self.check_fresh(output.id)?;
            if !matches!(output.status, TensorStatus::NotInit)
                || plan.makes.iter().any(|(id, _)| *id == output.id)
            {
                return Err(format!("{} is not a new tensor", Id(output.id)));
            }
            let bytes = bytes_of(&output.shape, output.dtype)
                .map_err(|e| format!("{}: {e}", Id(output.id)))?;
            plan.makes.push((
                output.id,
                Entry {
                    shape: output.shape.clone(),
                    dtype: output.dtype,
                    bytes,
                },
            ));
        }
        self.check_count(plan.makes.len())?;
        self.check_room(plan.bytes())?;
        Ok(plan)
    }

    /// Checks that `new` more tensors fit under [`MAX_TENSORS`].
    pub fn check_count(&self, new: usize) -> Result<(), String> {
        if self.tensors.len() + new > MAX_TENSORS {
            return Err(format!(
                "the trial holds {} tensors, and {new} more would pass the {MAX_TENSORS} the \
                 host keeps for one trial",
                self.tensors.len()
            ));
        }
        Ok(())
    }

    /// Checks that `id` names no tensor the trial holds.
    pub fn check_fresh(&self, id: TensorId) -> Result<(), String> {
        if self.tensors.contains_key(&id) {
            return Err(format!("{} already exists", Id(id)));
        }
        Ok(())
    }

    /// Bytes the trial's tensors may take together.
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// Every tensor held, by ascending id.
    pub fn entries(&self) -> Vec<(TensorId, &Entry)> {
        let mut entries: Vec<_> = self.tensors.iter().map(|(&id, (e, _))| (id, e)).collect();
        entries.sort_unstable_by_key(|(id, _)| id.value());
        entries
    }

    /// Checks that `more` bytes fit in the quota beside what is held.
    pub fn check_room(&self, more: u64) -> Result<(), String> {
        if self.bytes.saturating_add(more) > self.quota {
            return Err(format!(
                "the trial's tensors would take {} bytes, over its quota of {} \
                 (hold fewer or smaller tensors, or raise limits.compute_memory)",
                self.bytes.saturating_add(more),
                self.quota
            ));
        }
        Ok(())
    }

    /// Records a checked operation as done, its outputs holding
    /// `buffers`, in order.
    pub fn commit(&mut self, plan: Plan, buffers: &[Buffer]) {
        for id in plan.frees {
            self.free(id);
        }
        for ((id, entry), &buffer) in plan.makes.into_iter().zip(buffers) {
            self.insert(id, entry, buffer);
        }
    }

    /// Records a new tensor, which holds `buffer`.
    pub fn insert(&mut self, id: TensorId, entry: Entry, buffer: Buffer) {
        self.free(id);
        let held = self.buffers.entry(buffer.key).or_insert(Held {
            bytes: buffer.bytes,
            shown: 0,
            tensors: 0,
        });
        // A buffer no tensor held is not charged yet.
        if held.tensors > 0 {
            self.bytes -= held.charge();
        }
        held.bytes = held.bytes.max(buffer.bytes);
        held.shown += entry.bytes;
        held.tensors += 1;
        self.bytes += held.charge();
        self.tensors.insert(id, (entry, buffer.key));
    }

    /// Forgets `id`, and its buffer once no tensor holds it.
    pub fn free(&mut self, id: TensorId) {
        let Some((entry, key)) = self.tensors.remove(&id) else {
            return;
        };
        let held = self.buffers.get_mut(&key).expect("a held tensor's buffer");
        self.bytes -= held.charge();
        held.shown -= entry.bytes;
        held.tensors -= 1;
        if held.tensors == 0 {
            self.buffers.remove(&key);
        } else {
            self.bytes += held.charge();
        }
    }
}
