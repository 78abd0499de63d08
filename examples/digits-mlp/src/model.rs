//! A small multilayer perceptron for the 8x8 optical digits, in plain Rust.
//!
//! Nothing here knows about WebAssembly or the wtune SDK, so the same code
//! runs inside the guest and natively (in unit tests and benchmarks).
//!
//! The network is `64 -> hidden (ReLU) -> 10`, trained with softmax
//! cross-entropy and minibatch SGD with momentum and L2 weight decay. All
//! randomness (initialisation, the train/validation split, the per-epoch
//! shuffle) comes from [`SplitMix64`] seeded explicitly, and the arithmetic
//! is plain IEEE `f32` without fused or reordered operations, so a given
//! seed always produces the same weights.

use serde::{Deserialize, Serialize};

/// Pixels per example (an 8x8 image).
pub const FEATURES: usize = 64;
/// Number of classes (the digits 0 to 9).
pub const CLASSES: usize = 10;
/// The largest pixel value in the data set (each pixel counts the set bits
/// of a 4x4 block of the original 32x32 bitmap).
pub const MAX_PIXEL: u8 = 16;
/// Maps a pixel in `0..=16` onto `[0, 1]`; a power of two, so exact.
const PIXEL_SCALE: f32 = 1.0 / MAX_PIXEL as f32;
/// The seed of the default train/validation split, fixed so that every trial
/// of an experiment is scored on the same validation set.
pub const DEFAULT_SPLIT_SEED: u64 = 1998;
/// The share of each class held out for validation.
pub const VALIDATION_FRACTION: f64 = 0.2;
/// Rows per forward pass in [`Mlp::evaluate`]; bounds its scratch memory.
pub const EVAL_BATCH: usize = 256;

/// The SplitMix64 generator (Steele, Lea & Flood 2014): tiny, fast, and good
/// enough for initialisation and shuffling. Its whole state is one `u64`, so
/// it checkpoints with the model and resumes exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed` (any value, 0 included, is fine).
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform `f32` in `[0, 1)`, from the top 24 bits (an `f32`'s
    /// precision) so every value is exactly representable.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// A uniform index in `0..n` by multiply-shift; the bias is below 2^-50
    /// for the sizes used here, and no rejection loop keeps it branch-free.
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

/// Labelled 8x8 digit images, one row per example.
///
/// Pixels stay as their raw `0..=16` bytes (a quarter of the memory and
/// checkpoint size of `f32`) and are scaled to `[0, 1]` when a batch is
/// gathered for the network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dataset {
    /// Row-major, [`FEATURES`] bytes per example.
    pixels: Vec<u8>,
    labels: Vec<u8>,
}

impl Dataset {
    /// Parses the scikit-learn `digits.csv` format: no header, one example
    /// per line, 64 integer pixels in `0..=16` then the label `0..=9`, all
    /// separated by commas. Blank lines are skipped. Errors name the line
    /// (counting from 1) and, for a bad value, its column.
    pub fn parse_csv(text: &str) -> Result<Dataset, String> {
        let mut data = Dataset {
            pixels: Vec::new(),
            labels: Vec::new(),
        };
        for (index, line) in text.lines().enumerate() {
            if !line.trim().is_empty() {
                data.push_csv_row(line)
                    .map_err(|e| format!("line {}: {e}", index + 1))?;
            }
        }
        if data.is_empty() {
            return Err("no examples: the CSV has no data rows".to_owned());
        }
        Ok(data)
    }

    /// Appends one CSV row, leaving `self` unchanged on error.
    fn push_csv_row(&mut self, line: &str) -> Result<(), String> {
        let found = line.split(',').count();
        if found != FEATURES + 1 {
            return Err(format!(
                "expected {} comma-separated values ({FEATURES} pixels, then the label), found {found}",
                FEATURES + 1
            ));
        }
        let start = self.pixels.len();
        let mut fields = line.split(',').map(str::trim);
        for (column, field) in fields.by_ref().take(FEATURES).enumerate() {
            match field.parse::<u8>() {
                Ok(pixel) if pixel <= MAX_PIXEL => self.pixels.push(pixel),
                _ => {
                    self.pixels.truncate(start);
                    return Err(format!(
                        "column {}: pixel `{field}` is not an integer in 0..={MAX_PIXEL}",
                        column + 1
                    ));
                }
            }
        }
        let field = fields.next().unwrap_or_default();
        match field.parse::<u8>() {
            Ok(label) if usize::from(label) < CLASSES => self.labels.push(label),
            _ => {
                self.pixels.truncate(start);
                return Err(format!(
                    "column {}: label `{field}` is not a digit 0..=9",
                    FEATURES + 1
                ));
            }
        }
        Ok(())
    }

    /// The number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The raw pixels (`0..=16`) of example `i`.
    pub fn pixels(&self, i: usize) -> &[u8] {
        &self.pixels[i * FEATURES..(i + 1) * FEATURES]
    }

    /// The label (`0..=9`) of example `i`.
    pub fn label(&self, i: usize) -> u8 {
        self.labels[i]
    }

    /// How many examples each class has.
    pub fn class_counts(&self) -> [usize; CLASSES] {
        let mut counts = [0; CLASSES];
        for &label in &self.labels {
            counts[usize::from(label)] += 1;
        }
        counts
    }

    /// Splits into `(train, validation)`, holding out `val_fraction` of each
    /// class (rounded) so both sides keep the class balance. The examples
    /// chosen depend only on `seed`; each side keeps the file's order.
    pub fn stratified_split(&self, val_fraction: f64, seed: u64) -> (Dataset, Dataset) {
        let mut rng = SplitMix64::new(seed);
        let mut train = Vec::with_capacity(self.len());
        let mut val = Vec::new();
        for class in 0..CLASSES {
            let mut members: Vec<usize> = (0..self.len())
                .filter(|&i| usize::from(self.labels[i]) == class)
                .collect();
            rng.shuffle(&mut members);
            let held_out = (members.len() as f64 * val_fraction).round() as usize;
            let held_out = held_out.min(members.len());
            val.extend_from_slice(&members[..held_out]);
            train.extend_from_slice(&members[held_out..]);
        }
        train.sort_unstable();
        val.sort_unstable();
        (self.subset(&train), self.subset(&val))
    }

    /// The examples at `indices`, in that order.
    fn subset(&self, indices: &[usize]) -> Dataset {
        let mut pixels = Vec::with_capacity(indices.len() * FEATURES);
        for &i in indices {
            pixels.extend_from_slice(self.pixels(i));
        }
        Dataset {
            pixels,
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
        }
    }

    /// Writes example `i`'s pixels, scaled to `[0, 1]`, into `out`.
    pub fn scaled_into(&self, i: usize, out: &mut [f32]) {
        for (x, &pixel) in out.iter_mut().zip(self.pixels(i)) {
            *x = f32::from(pixel) * PIXEL_SCALE;
        }
    }
}

/// Optimiser settings for [`Mlp::train_epoch`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sgd {
    /// Step size.
    pub lr: f32,
    /// Momentum coefficient, in `[0, 1)`.
    pub momentum: f32,
    /// L2 penalty on the weights (not the biases), added to the gradient.
    pub weight_decay: f32,
    /// Examples per update; the last batch of an epoch may be smaller.
    pub batch_size: usize,
}

/// Loss and accuracy of a model on a data set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean softmax cross-entropy (natural log).
    pub loss: f64,
    /// Share of examples whose highest-scoring class is the label.
    pub accuracy: f64,
}

/// One set of tensors shaped like the network's parameters; used for the
/// parameters themselves, their momentum buffers, and gradients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Params {
    /// Input-to-hidden weights, `FEATURES x hidden`, row-major. Stored
    /// input-major so the forward and backward passes are `axpy`s over
    /// contiguous hidden units (which vectorise), and zero pixels (about half
    /// of them) can be skipped outright.
    w1: Vec<f32>,
    /// Hidden biases.
    b1: Vec<f32>,
    /// Hidden-to-output weights, `hidden x CLASSES`, row-major.
    w2: Vec<f32>,
    /// Output biases.
    b2: Vec<f32>,
}

impl Params {
    fn zeros(hidden: usize) -> Self {
        Self {
            w1: vec![0.0; FEATURES * hidden],
            b1: vec![0.0; hidden],
            w2: vec![0.0; hidden * CLASSES],
            b2: vec![0.0; CLASSES],
        }
    }

    /// He (Kaiming) uniform initialisation: weights uniform in
    /// `±sqrt(6 / fan_in)`, biases zero. Uniform rather than normal so no
    /// transcendental functions are involved and the initial weights are
    /// bit-identical on every platform.
    fn he_uniform(hidden: usize, rng: &mut SplitMix64) -> Self {
        let mut params = Self::zeros(hidden);
        fill_uniform(&mut params.w1, (6.0 / FEATURES as f32).sqrt(), rng);
        fill_uniform(&mut params.w2, (6.0 / hidden as f32).sqrt(), rng);
        params
    }

    fn clear(&mut self) {
        for tensor in [&mut self.w1, &mut self.b1, &mut self.w2, &mut self.b2] {
            tensor.fill(0.0);
        }
    }
}

fn fill_uniform(values: &mut [f32], bound: f32, rng: &mut SplitMix64) {
    for value in values {
        *value = (2.0 * rng.next_f32() - 1.0) * bound;
    }
}

/// `y += a * x`, the kernel of both passes.
#[inline]
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

#[inline]
fn dot(x: &[f32], y: &[f32]) -> f32 {
    x.iter().zip(y).map(|(&x, &y)| x * y).sum()
}

/// One SGD-with-momentum step on a tensor (PyTorch's formulation):
/// `v = momentum * v + (g + decay * p)`, then `p -= lr * v`.
fn sgd_step(params: &mut [f32], velocity: &mut [f32], grads: &[f32], sgd: &Sgd, decay: f32) {
    for ((p, v), &g) in params.iter_mut().zip(velocity.iter_mut()).zip(grads) {
        *v = sgd.momentum * *v + (g + decay * *p);
        *p -= sgd.lr * *v;
    }
}

/// Per-call scratch buffers, sized for `rows` examples at a time, so the
/// inner loops never allocate.
struct Workspace {
    /// Scaled inputs, `rows x FEATURES`.
    inputs: Vec<f32>,
    /// Hidden activations after ReLU, `rows x hidden`.
    hidden: Vec<f32>,
    /// Logits, then probabilities, then the loss gradient, `rows x CLASSES`.
    outputs: Vec<f32>,
    /// Gradient at the hidden pre-activations, `rows x hidden`.
    hidden_grad: Vec<f32>,
    grads: Params,
}

impl Workspace {
    fn new(rows: usize, hidden: usize) -> Self {
        Self {
            inputs: vec![0.0; rows * FEATURES],
            hidden: vec![0.0; rows * hidden],
            outputs: vec![0.0; rows * CLASSES],
            hidden_grad: vec![0.0; rows * hidden],
            grads: Params::zeros(hidden),
        }
    }
}

/// The network, its optimiser state, and the generator that shuffles its
/// epochs: everything needed to resume training exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mlp {
    hidden: usize,
    params: Params,
    velocity: Params,
    rng: SplitMix64,
}

impl Mlp {
    /// A freshly initialised network with `hidden` ReLU units; `seed` drives
    /// the initial weights and the order of every epoch.
    ///
    /// # Panics
    /// If `hidden` is 0.
    pub fn new(hidden: usize, seed: u64) -> Self {
        assert!(hidden > 0, "an MLP needs at least one hidden unit");
        let mut rng = SplitMix64::new(seed);
        let params = Params::he_uniform(hidden, &mut rng);
        Self {
            hidden,
            params,
            velocity: Params::zeros(hidden),
            rng,
        }
    }

    /// The number of hidden units.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// The parameters and their momentum buffers as `[w1, b1, w2, b2]`
    /// (`w1` is `FEATURES x hidden`, `w2` is `hidden x CLASSES`, both
    /// row-major), for a copy of the network whose math runs elsewhere.
    pub fn tensors(&self) -> [[&[f32]; 4]; 2] {
        let (p, v) = (&self.params, &self.velocity);
        [[&p.w1, &p.b1, &p.w2, &p.b2], [&v.w1, &v.b1, &v.w2, &v.b2]]
    }

    /// Overwrites the parameters and momentum buffers (same order and
    /// shapes as [`Mlp::tensors`]).
    ///
    /// # Panics
    /// If a shape differs.
    pub fn set_tensors(&mut self, tensors: [[Vec<f32>; 4]; 2]) {
        let [params, velocity] = tensors;
        for (set, values) in [(&mut self.params, params), (&mut self.velocity, velocity)] {
            let [w1, b1, w2, b2] = values;
            let shapes = [set.w1.len(), set.b1.len(), set.w2.len(), set.b2.len()];
            assert_eq!(shapes, [w1.len(), b1.len(), w2.len(), b2.len()]);
            *set = Params { w1, b1, w2, b2 };
        }
    }

    /// The order of the next epoch: a seeded shuffle of `0..len`, drawn as
    /// [`Mlp::train_epoch`] draws it.
    pub fn epoch_order(&mut self, len: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..len).collect();
        self.rng.shuffle(&mut order);
        order
    }

    /// The number of trainable parameters.
    pub fn parameter_count(&self) -> usize {
        (FEATURES + 1) * self.hidden + (self.hidden + 1) * CLASSES
    }

    /// One pass over `data` in a fresh random order, updating after each
    /// minibatch. Returns the mean cross-entropy of the examples, each
    /// measured just before the update its batch contributed to.
    ///
    /// # Panics
    /// If `sgd.batch_size` is 0.
    pub fn train_epoch(&mut self, data: &Dataset, sgd: &Sgd) -> f64 {
        assert!(sgd.batch_size > 0, "batch_size must be at least 1");
        if data.is_empty() {
            return 0.0;
        }
        let order = self.epoch_order(data.len());
        let mut ws = Workspace::new(sgd.batch_size.min(data.len()), self.hidden);
        let mut total_loss = 0.0;
        for batch in order.chunks(sgd.batch_size) {
            total_loss += self.train_batch(data, batch, sgd, &mut ws);
        }
        total_loss / data.len() as f64
    }

    /// Loss and accuracy on `data`, without changing the model.
    pub fn evaluate(&self, data: &Dataset) -> Evaluation {
        if data.is_empty() {
            return Evaluation {
                loss: 0.0,
                accuracy: 0.0,
            };
        }
        let mut ws = Workspace::new(EVAL_BATCH.min(data.len()), self.hidden);
        let indices: Vec<usize> = (0..data.len()).collect();
        let (mut total_loss, mut correct) = (0.0, 0usize);
        for batch in indices.chunks(EVAL_BATCH) {
            self.gather(data, batch, &mut ws);
            self.forward(batch.len(), &mut ws);
            for (row, &i) in batch.iter().enumerate() {
                let logits = &ws.outputs[row * CLASSES..(row + 1) * CLASSES];
                let label = usize::from(data.label(i));
                total_loss += f64::from(cross_entropy(logits, label));
                correct += usize::from(argmax(logits) == label);
            }
        }
        Evaluation {
            loss: total_loss / data.len() as f64,
            accuracy: correct as f64 / data.len() as f64,
        }
    }

    /// Forward, backward and update on one minibatch; returns its summed loss.
    fn train_batch(
        &mut self,
        data: &Dataset,
        batch: &[usize],
        sgd: &Sgd,
        ws: &mut Workspace,
    ) -> f64 {
        let rows = batch.len();
        self.gather(data, batch, ws);
        self.forward(rows, ws);
        let mut loss = 0.0;
        for (row, &i) in batch.iter().enumerate() {
            let out = &mut ws.outputs[row * CLASSES..(row + 1) * CLASSES];
            let label = usize::from(data.label(i));
            loss += f64::from(cross_entropy(out, label));
            softmax_grad_in_place(out, label, 1.0 / rows as f32);
        }
        self.backward(rows, ws);
        self.apply(&ws.grads, sgd);
        loss
    }

    /// Copies the batch's examples, scaled, into `ws.inputs`.
    fn gather(&self, data: &Dataset, batch: &[usize], ws: &mut Workspace) {
        for (row, &i) in batch.iter().enumerate() {
            data.scaled_into(i, &mut ws.inputs[row * FEATURES..(row + 1) * FEATURES]);
        }
    }

    /// Fills `ws.hidden` (after ReLU) and `ws.outputs` (logits) for the
    /// first `rows` rows of `ws.inputs`.
    fn forward(&self, rows: usize, ws: &mut Workspace) {
        let h = self.hidden;
        let p = &self.params;
        for row in 0..rows {
            let x = &ws.inputs[row * FEATURES..(row + 1) * FEATURES];
            let hidden = &mut ws.hidden[row * h..(row + 1) * h];
            hidden.copy_from_slice(&p.b1);
            for (d, &xv) in x.iter().enumerate() {
                if xv != 0.0 {
                    axpy(xv, &p.w1[d * h..(d + 1) * h], hidden);
                }
            }
            for a in hidden.iter_mut() {
                *a = a.max(0.0);
            }
            let logits = &mut ws.outputs[row * CLASSES..(row + 1) * CLASSES];
            logits.copy_from_slice(&p.b2);
            for (j, &a) in hidden.iter().enumerate() {
                // ReLU leaves many units at exactly zero; they add nothing.
                if a != 0.0 {
                    axpy(a, &p.w2[j * CLASSES..(j + 1) * CLASSES], logits);
                }
            }
        }
    }

    /// Accumulates into `ws.grads` the gradients for the first `rows` rows,
    /// given the loss gradient at the logits in `ws.outputs`.
    fn backward(&self, rows: usize, ws: &mut Workspace) {
        let h = self.hidden;
        let w2 = &self.params.w2;
        let g = &mut ws.grads;
        g.clear();
        for row in 0..rows {
            let x = &ws.inputs[row * FEATURES..(row + 1) * FEATURES];
            let hidden = &ws.hidden[row * h..(row + 1) * h];
            let out_grad = &ws.outputs[row * CLASSES..(row + 1) * CLASSES];
            let hidden_grad = &mut ws.hidden_grad[row * h..(row + 1) * h];

            axpy(1.0, out_grad, &mut g.b2);
            for (j, (&a, dh)) in hidden.iter().zip(hidden_grad.iter_mut()).enumerate() {
                let w2_row = j * CLASSES..(j + 1) * CLASSES;
                // A unit ReLU switched off passes no gradient either way.
                if a > 0.0 {
                    axpy(a, out_grad, &mut g.w2[w2_row.clone()]);
                    *dh = dot(&w2[w2_row], out_grad);
                } else {
                    *dh = 0.0;
                }
            }

            axpy(1.0, hidden_grad, &mut g.b1);
            for (d, &xv) in x.iter().enumerate() {
                if xv != 0.0 {
                    axpy(xv, hidden_grad, &mut g.w1[d * h..(d + 1) * h]);
                }
            }
        }
    }

    /// Applies one optimiser step; weight decay spares the biases, as usual.
    fn apply(&mut self, grads: &Params, sgd: &Sgd) {
        let (p, v) = (&mut self.params, &mut self.velocity);
        sgd_step(&mut p.w1, &mut v.w1, &grads.w1, sgd, sgd.weight_decay);
        sgd_step(&mut p.b1, &mut v.b1, &grads.b1, sgd, 0.0);
        sgd_step(&mut p.w2, &mut v.w2, &grads.w2, sgd, sgd.weight_decay);
        sgd_step(&mut p.b2, &mut v.b2, &grads.b2, sgd, 0.0);
    }
}

/// Softmax cross-entropy of `logits` against `label`, computed as
/// `logsumexp(logits) - logits[label]` with the maximum subtracted first so
/// large logits cannot overflow.
pub fn cross_entropy(logits: &[f32], label: usize) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&z| (z - max).exp()).sum();
    sum.ln() - (logits[label] - max)
}

/// Replaces `logits` with the gradient of `scale` times the cross-entropy:
/// `scale * (softmax(logits) - onehot(label))`.
pub fn softmax_grad_in_place(logits: &mut [f32], label: usize, scale: f32) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for z in logits.iter_mut() {
        *z = (*z - max).exp();
        sum += *z;
    }
    let norm = scale / sum;
    for z in logits.iter_mut() {
        *z *= norm;
    }
    logits[label] -= scale;
}

/// The index of the largest value; the first one on ties.
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CSV row with every pixel `pixel` and the given label.
    fn row(pixel: u8, label: u8) -> String {
        let mut fields = vec![pixel.to_string(); FEATURES];
        fields.push(label.to_string());
        fields.join(",")
    }

    fn shipped_data() -> Dataset {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/digits.csv");
        let text = std::fs::read_to_string(path).expect("the shipped data set");
        Dataset::parse_csv(&text).expect("the shipped data set parses")
    }

    #[test]
    fn parses_good_rows_and_scales_pixels() {
        let text = format!("{}\r\n\n{}\n", row(16, 3), row(0, 9));
        let data = Dataset::parse_csv(&text).unwrap();
        assert_eq!(data.len(), 2);
        assert_eq!((data.label(0), data.label(1)), (3, 9));
        assert!(data.pixels(0).iter().all(|&p| p == 16));
        let mut scaled = [0.5; FEATURES];
        data.scaled_into(0, &mut scaled);
        assert!(scaled.iter().all(|&x| x == 1.0));
        data.scaled_into(1, &mut scaled);
        assert!(scaled.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn malformed_rows_are_reported_with_their_line() {
        let good = row(1, 1);
        let cases = [
            (
                format!("{good}\n1,2,3\n"),
                "line 2: expected 65 comma-separated values",
            ),
            (format!("{good},4\n"), "found 66"),
            (
                good.replacen('1', "x", 1),
                "line 1: column 1: pixel `x` is not an integer",
            ),
            (
                format!("{good}\n{}", row(17, 0)),
                "line 2: column 1: pixel `17`",
            ),
            (
                format!("{good}\n\n{}", row(2, 10)),
                "line 3: column 65: label `10`",
            ),
            (
                row(2, 0).replacen(",2", ", 2.5", 1),
                "column 2: pixel `2.5`",
            ),
            (String::new(), "no examples"),
            ("\n  \n".to_owned(), "no examples"),
        ];
        for (text, expected) in cases {
            let err = Dataset::parse_csv(&text).unwrap_err();
            assert!(
                err.contains(expected),
                "{text:?}: got {err:?}, want {expected:?}"
            );
        }
    }

    #[test]
    fn the_shipped_data_is_complete() {
        let data = shipped_data();
        assert_eq!(data.len(), 1797);
        assert!(
            data.class_counts()
                .iter()
                .all(|&n| (170..=190).contains(&n))
        );
    }

    #[test]
    fn the_split_is_stratified_disjoint_and_seeded() {
        let data = shipped_data();
        let (train, val) = data.stratified_split(VALIDATION_FRACTION, DEFAULT_SPLIT_SEED);
        assert_eq!(train.len() + val.len(), data.len());
        for (all, (t, v)) in data
            .class_counts()
            .iter()
            .zip(train.class_counts().iter().zip(val.class_counts()))
        {
            assert_eq!(t + v, *all);
            assert_eq!(v, (*all as f64 * VALIDATION_FRACTION).round() as usize);
        }
        let again = data.stratified_split(VALIDATION_FRACTION, DEFAULT_SPLIT_SEED);
        assert_eq!((&train, &val), (&again.0, &again.1));
        let other = data.stratified_split(VALIDATION_FRACTION, DEFAULT_SPLIT_SEED + 1);
        assert_ne!(val, other.1);
    }

    #[test]
    fn shuffle_is_a_seeded_permutation() {
        let mut a: Vec<u32> = (0..100).collect();
        let mut b = a.clone();
        SplitMix64::new(5).shuffle(&mut a);
        SplitMix64::new(5).shuffle(&mut b);
        assert_eq!(a, b);
        assert_ne!(a, (0..100).collect::<Vec<_>>());
        a.sort_unstable();
        assert_eq!(a, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn gradients_match_finite_differences() {
        let data = shipped_data();
        let batch: Vec<usize> = (0..8).collect();
        let mlp = Mlp::new(6, 3);
        let mut ws = Workspace::new(batch.len(), mlp.hidden);
        let loss_of = |mlp: &Mlp, ws: &mut Workspace| {
            mlp.gather(&data, &batch, ws);
            mlp.forward(batch.len(), ws);
            let sum: f64 = batch
                .iter()
                .enumerate()
                .map(|(row, &i)| {
                    let logits = &ws.outputs[row * CLASSES..(row + 1) * CLASSES];
                    f64::from(cross_entropy(logits, usize::from(data.label(i))))
                })
                .sum();
            sum / batch.len() as f64
        };
        loss_of(&mlp, &mut ws);
        for (row, &i) in batch.iter().enumerate() {
            let out = &mut ws.outputs[row * CLASSES..(row + 1) * CLASSES];
            softmax_grad_in_place(out, usize::from(data.label(i)), 1.0 / batch.len() as f32);
        }
        mlp.backward(batch.len(), &mut ws);
        let mut analytic = ws.grads.clone();

        /// Picks one tensor out of a parameter set.
        type Tensor = fn(&mut Params) -> &mut Vec<f32>;
        let tensors: [Tensor; 4] = [|p| &mut p.w1, |p| &mut p.b1, |p| &mut p.w2, |p| &mut p.b2];
        let eps = 1e-2;
        for tensor in tensors {
            // The steepest entry: a clear signal well above f32 rounding noise.
            let grads = tensor(&mut analytic);
            let magnitudes: Vec<f32> = grads.iter().map(|g| g.abs()).collect();
            let index = argmax(&magnitudes);
            let expected = grads[index];
            assert!(
                expected.abs() > 1e-2,
                "gradient {expected} is too flat to check"
            );
            let mut plus = mlp.clone();
            tensor(&mut plus.params)[index] += eps;
            let mut minus = mlp.clone();
            tensor(&mut minus.params)[index] -= eps;
            let numeric =
                (loss_of(&plus, &mut ws) - loss_of(&minus, &mut ws)) / (2.0 * f64::from(eps));
            assert!(
                (numeric - f64::from(expected)).abs() < 2e-3,
                "index {index}: numeric {numeric}, analytic {expected}"
            );
        }
    }
}
