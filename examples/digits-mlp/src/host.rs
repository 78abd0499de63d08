//! The same network with its math on the host's compute interface
//! (`math = "host"`): the weights live in host tensors, the products run as
//! host kernels (a GPU, or the host's CPU at native speed), and only the
//! batch's inputs, its logits and their gradient cross the boundary.
//!
//! The loss and its gradient at the logits (ten values a row) stay in wasm
//! and reuse [`model`]'s functions, so both paths score the same way. The
//! results match the wasm path's closely but not bit for bit: the host
//! sums in a different order.

use wtune_guest::Result;
use wtune_guest::compute::{Axis, Binary, Reduce, Tensor, Unary, raw};

use crate::model::{
    self, CLASSES, Dataset, EVAL_BATCH, Evaluation, FEATURES, Mlp, Sgd, argmax, cross_entropy,
};

/// `[w1, b1, w2, b2]`, as in [`Mlp::tensors`].
type Set = [Tensor; 4];

/// The network on the host's device. `mirror` keeps the random generator
/// and, after every epoch, a copy of the weights, so a guest checkpoint
/// (`checkpoint = serde`) of the trainable stays current.
pub struct HostMlp {
    hidden: u32,
    params: Set,
    velocity: Set,
    grads: Set,
    /// Scratch for up to `capacity` rows: inputs, hidden activations,
    /// logits (then their gradient) and the hidden gradient.
    x: Tensor,
    h: Tensor,
    logits: Tensor,
    dh: Tensor,
    capacity: u32,
}

fn shapes(hidden: u32) -> [(u32, u32); 4] {
    let (f, c) = (FEATURES as u32, CLASSES as u32);
    [(f, hidden), (1, hidden), (hidden, c), (1, c)]
}

fn upload(hidden: u32, values: [&[f32]; 4]) -> Result<Set> {
    let s = shapes(hidden);
    Ok([
        Tensor::from_rows(s[0].0, s[0].1, values[0])?,
        Tensor::from_rows(s[1].0, s[1].1, values[1])?,
        Tensor::from_rows(s[2].0, s[2].1, values[2])?,
        Tensor::from_rows(s[3].0, s[3].1, values[3])?,
    ])
}

fn read(set: &Set) -> Result<[Vec<f32>; 4]> {
    Ok([
        set[0].to_vec()?,
        set[1].to_vec()?,
        set[2].to_vec()?,
        set[3].to_vec()?,
    ])
}

/// `op(a) x op(b)` into `out`, for the first `m` rows of the result.
#[allow(clippy::too_many_arguments)]
fn product(
    a: &Tensor,
    transpose_a: bool,
    b: &Tensor,
    transpose_b: bool,
    out: &Tensor,
    m: u32,
    n: u32,
    k: u32,
) -> Result<()> {
    let spec = raw::MatmulSpec {
        m,
        n,
        k,
        transpose_a,
        transpose_b,
        alpha: 1.0,
        beta: 0.0,
    };
    Ok(raw::matmul(a.buffer(), b.buffer(), out.buffer(), spec)?)
}

impl HostMlp {
    /// Uploads `mlp`'s weights and momentum; scratch for `rows` rows.
    pub fn upload(mlp: &Mlp, rows: usize) -> Result<Self> {
        let hidden = mlp.hidden() as u32;
        let [params, velocity] = mlp.tensors();
        let s = shapes(hidden);
        let zeros = |i: usize| Tensor::zeros(s[i].0, s[i].1);
        let capacity = rows.max(1) as u32;
        Ok(Self {
            hidden,
            params: upload(hidden, params)?,
            velocity: upload(hidden, velocity)?,
            grads: [zeros(0)?, zeros(1)?, zeros(2)?, zeros(3)?],
            x: Tensor::zeros(capacity, FEATURES as u32)?,
            h: Tensor::zeros(capacity, hidden)?,
            logits: Tensor::zeros(capacity, CLASSES as u32)?,
            dh: Tensor::zeros(capacity, hidden)?,
            capacity,
        })
    }

    /// Makes the scratch tensors hold at least `rows` rows.
    fn reserve(&mut self, rows: usize) -> Result<()> {
        let rows = rows as u32;
        if rows > self.capacity {
            self.x = Tensor::zeros(rows, FEATURES as u32)?;
            self.h = Tensor::zeros(rows, self.hidden)?;
            self.logits = Tensor::zeros(rows, CLASSES as u32)?;
            self.dh = Tensor::zeros(rows, self.hidden)?;
            self.capacity = rows;
        }
        Ok(())
    }

    /// One epoch in `mirror`'s order, as [`Mlp::train_epoch`] does; then
    /// copies the weights back into `mirror`.
    pub fn train_epoch(&mut self, mirror: &mut Mlp, data: &Dataset, sgd: &Sgd) -> Result<f64> {
        if data.is_empty() {
            return Ok(0.0);
        }
        let order = mirror.epoch_order(data.len());
        self.reserve(sgd.batch_size.min(data.len()))?;
        let mut total_loss = 0.0;
        for batch in order.chunks(sgd.batch_size) {
            total_loss += self.train_batch(data, batch, sgd)?;
        }
        mirror.set_tensors([read(&self.params)?, read(&self.velocity)?]);
        Ok(total_loss / data.len() as f64)
    }

    /// Loss and accuracy on `data`.
    pub fn evaluate(&mut self, data: &Dataset) -> Result<Evaluation> {
        if data.is_empty() {
            return Ok(Evaluation {
                loss: 0.0,
                accuracy: 0.0,
            });
        }
        self.reserve(EVAL_BATCH.min(data.len()))?;
        let indices: Vec<usize> = (0..data.len()).collect();
        let (mut total_loss, mut correct) = (0.0, 0usize);
        for batch in indices.chunks(EVAL_BATCH) {
            let logits = self.forward(data, batch)?;
            for (row, &i) in batch.iter().enumerate() {
                let logits = &logits[row * CLASSES..(row + 1) * CLASSES];
                let label = usize::from(data.label(i));
                total_loss += f64::from(cross_entropy(logits, label));
                correct += usize::from(argmax(logits) == label);
            }
        }
        Ok(Evaluation {
            loss: total_loss / data.len() as f64,
            accuracy: correct as f64 / data.len() as f64,
        })
    }

    /// Uploads the batch and runs the forward pass; returns the logits.
    fn forward(&mut self, data: &Dataset, batch: &[usize]) -> Result<Vec<f32>> {
        let (rows, h) = (batch.len() as u32, self.hidden);
        let mut inputs = vec![0.0; batch.len() * FEATURES];
        for (row, &i) in batch.iter().enumerate() {
            data.scaled_into(i, &mut inputs[row * FEATURES..(row + 1) * FEATURES]);
        }
        self.x.write_rows(0, &inputs)?;
        let [w1, b1, w2, b2] = &self.params;
        let c = CLASSES as u32;
        product(&self.x, false, w1, false, &self.h, rows, h, FEATURES as u32)?;
        let hb = self.h.buffer();
        raw::binary_rows(Binary::Add, hb, b1.buffer(), hb, rows, h)?;
        raw::unary(Unary::Relu, hb, hb, rows as u64 * h as u64)?;
        product(&self.h, false, w2, false, &self.logits, rows, c, h)?;
        let lb = self.logits.buffer();
        raw::binary_rows(Binary::Add, lb, b2.buffer(), lb, rows, c)?;
        Ok(self.logits.read_rows(0, rows)?)
    }

    /// Forward, backward and update on one minibatch; its summed loss.
    fn train_batch(&mut self, data: &Dataset, batch: &[usize], sgd: &Sgd) -> Result<f64> {
        let (rows, h, c) = (batch.len() as u32, self.hidden, CLASSES as u32);
        let mut grad = self.forward(data, batch)?;
        let mut loss = 0.0;
        for (row, &i) in batch.iter().enumerate() {
            let out = &mut grad[row * CLASSES..(row + 1) * CLASSES];
            let label = usize::from(data.label(i));
            loss += f64::from(cross_entropy(out, label));
            model::softmax_grad_in_place(out, label, 1.0 / rows as f32);
        }
        self.logits.write_rows(0, &grad)?;

        let [gw1, gb1, gw2, gb2] = &self.grads;
        let [_, _, w2, _] = &self.params;
        // dW2 = H^T dZ; db2 = column sums of dZ; dH = dZ W2^T, zero where
        // the ReLU was off; dW1 = X^T dH; db1 = column sums of dH.
        product(&self.h, true, &self.logits, false, gw2, h, c, rows)?;
        let sum = |x: &Tensor, out: &Tensor, cols| {
            raw::reduce(
                Reduce::Sum,
                Axis::Cols,
                x.buffer(),
                out.buffer(),
                rows,
                cols,
            )
        };
        sum(&self.logits, gb2, c)?;
        product(&self.logits, false, w2, true, &self.dh, rows, h, c)?;
        let db = self.dh.buffer();
        raw::binary(
            Binary::ReluBackward,
            db,
            self.h.buffer(),
            db,
            rows as u64 * h as u64,
        )?;
        product(
            &self.x,
            true,
            &self.dh,
            false,
            gw1,
            FEATURES as u32,
            h,
            rows,
        )?;
        sum(&self.dh, gb1, h)?;

        // PyTorch's SGD with momentum: v = momentum v + (g + decay p),
        // p -= lr v; weight decay spares the biases.
        for (i, decay) in [sgd.weight_decay, 0.0, sgd.weight_decay, 0.0]
            .into_iter()
            .enumerate()
        {
            let (p, v, g) = (&self.params[i], &mut self.velocity[i], &self.grads[i]);
            v.affine_in_place(sgd.momentum, 0.0)?;
            v.axpy(1.0, g)?;
            if decay != 0.0 {
                v.axpy(decay, p)?;
            }
            let p = &mut self.params[i];
            p.axpy(-sgd.lr, &self.velocity[i])?;
        }
        Ok(loss)
    }
}

impl std::fmt::Debug for HostMlp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMlp")
            .field("hidden", &self.hidden)
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// The network's copy on the host's device, made on demand. A clone of the
/// trainable starts without one and uploads its `Mlp` again: host tensors
/// belong to one instance.
#[derive(Debug, Default)]
pub struct OnDevice(pub Option<HostMlp>);

impl Clone for OnDevice {
    fn clone(&self) -> Self {
        Self(None)
    }
}
