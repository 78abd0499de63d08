//! The UCI optical digits: parsing, the train/validation split and batching.
//!
//! The CSV format, the [`SplitMix64`] generator and the stratified split are
//! the same as in `examples/digits-mlp` (same algorithm, same default split
//! seed), so this CNN is scored on exactly the validation examples the MLP is
//! and the two examples' `val_accuracy` can be compared directly.

use burn::tensor::{Device, Int, Tensor, TensorData};

/// Pixels per example (an 8x8 image).
pub const FEATURES: usize = 64;
/// Image side length; the network sees `[batch, 1, SIDE, SIDE]`.
pub const SIDE: usize = 8;
/// Number of classes (the digits 0 to 9).
pub const CLASSES: usize = 10;
/// The largest pixel value (each pixel counts the set bits of a 4x4 block).
pub const MAX_PIXEL: u8 = 16;
/// Seed of the train/validation split: fixed, and the same as digits-mlp's,
/// so every trial (of either example) is scored on the same examples.
pub const SPLIT_SEED: u64 = 1998;
/// The share of each class held out for validation.
pub const VALIDATION_FRACTION: f64 = 0.2;

/// The SplitMix64 generator (Steele, Lea & Flood 2014). Its whole state is
/// one `u64`, so the epoch order is reproducible from the seed and survives
/// host snapshots without any code here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed` (any value, 0 included).
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

    /// A uniform index in `0..n` by multiply-shift (bias below 2^-50 here).
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

/// Labelled 8x8 digit images. Pixels stay raw bytes (`0..=16`) and are
/// scaled to `[0, 1]` only when a batch becomes a tensor, which keeps the
/// guest's memory (and so every host snapshot) small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataset {
    /// Row-major, [`FEATURES`] bytes per example.
    pixels: Vec<u8>,
    labels: Vec<u8>,
}

impl Dataset {
    /// Parses scikit-learn's `digits.csv`: no header, one example per line,
    /// 64 integer pixels in `0..=16` then the label `0..=9`. Blank lines are
    /// skipped; errors name the line (from 1) and, for a bad value, the column.
    pub fn parse_csv(text: &str) -> Result<Dataset, String> {
        let mut data = Dataset {
            pixels: Vec::new(),
            labels: Vec::new(),
        };
        for (index, line) in text.lines().enumerate() {
            if !line.trim().is_empty() {
                data.push_row(line)
                    .map_err(|e| format!("line {}: {e}", index + 1))?;
            }
        }
        if data.is_empty() {
            return Err("no examples: the CSV has no data rows".to_owned());
        }
        Ok(data)
    }

    /// Appends one CSV row, leaving `self` unchanged on error.
    fn push_row(&mut self, line: &str) -> Result<(), String> {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != FEATURES + 1 {
            return Err(format!(
                "expected {} comma-separated values ({FEATURES} pixels, then the label), found {}",
                FEATURES + 1,
                fields.len()
            ));
        }
        let mut pixels = [0u8; FEATURES];
        for (column, (field, pixel)) in fields.iter().zip(pixels.iter_mut()).enumerate() {
            *pixel = field
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= MAX_PIXEL)
                .ok_or_else(|| {
                    format!(
                        "column {}: pixel `{field}` is not an integer in 0..={MAX_PIXEL}",
                        column + 1
                    )
                })?;
        }
        let field = fields[FEATURES];
        let label = field
            .parse::<u8>()
            .ok()
            .filter(|&l| usize::from(l) < CLASSES)
            .ok_or_else(|| {
                format!(
                    "column {}: label `{field}` is not a digit 0..=9",
                    FEATURES + 1
                )
            })?;
        self.pixels.extend_from_slice(&pixels);
        self.labels.push(label);
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

    /// How many examples each class has.
    pub fn class_counts(&self) -> [usize; CLASSES] {
        let mut counts = [0; CLASSES];
        for &label in &self.labels {
            counts[usize::from(label)] += 1;
        }
        counts
    }

    /// Splits into `(train, validation)`, holding out `val_fraction` of each
    /// class (rounded) so both sides keep the class balance. Identical to
    /// digits-mlp's `Dataset::stratified_split` for the same seed.
    pub fn stratified_split(&self, val_fraction: f64, seed: u64) -> (Dataset, Dataset) {
        let mut rng = SplitMix64::new(seed);
        let mut train = Vec::with_capacity(self.len());
        let mut val = Vec::new();
        for class in 0..CLASSES {
            let mut members: Vec<usize> = (0..self.len())
                .filter(|&i| usize::from(self.labels[i]) == class)
                .collect();
            rng.shuffle(&mut members);
            let held_out =
                ((members.len() as f64 * val_fraction).round() as usize).min(members.len());
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
            pixels.extend_from_slice(&self.pixels[i * FEATURES..(i + 1) * FEATURES]);
        }
        Dataset {
            pixels,
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
        }
    }

    /// The examples at `indices` as network input `[n, 1, 8, 8]` (pixels
    /// scaled to `[0, 1]`) and their labels `[n]`, created on `device`.
    pub fn batch(&self, indices: &[usize], device: &Device) -> (Tensor<4>, Tensor<1, Int>) {
        let scale = 1.0 / f32::from(MAX_PIXEL);
        let mut images = Vec::with_capacity(indices.len() * FEATURES);
        for &i in indices {
            let row = &self.pixels[i * FEATURES..(i + 1) * FEATURES];
            images.extend(row.iter().map(|&p| f32::from(p) * scale));
        }
        let labels: Vec<i64> = indices.iter().map(|&i| i64::from(self.labels[i])).collect();
        let n = indices.len();
        let images = Tensor::from_data(TensorData::new(images, [n, 1, SIDE, SIDE]), device);
        let labels = Tensor::from_data(TensorData::new(labels, [n]), device);
        (images, labels)
    }

    /// The label (`0..=9`) of example `i`.
    pub fn label(&self, i: usize) -> u8 {
        self.labels[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn shipped() -> Dataset {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../digits-mlp/data/digits.csv"
        ))
        .expect("the digits-mlp data set");
        Dataset::parse_csv(&text).unwrap()
    }

    #[test]
    fn parses_and_rejects_bad_rows() {
        let good = vec!["16"; FEATURES].join(",") + ",3";
        let data = Dataset::parse_csv(&format!("{good}\n\n{good}\n")).unwrap();
        assert_eq!((data.len(), data.label(1)), (2, 3));
        assert!(Dataset::parse_csv("1,2,3").unwrap_err().contains("line 1"));
        let bad_pixel = good.replacen("16", "17", 1);
        assert!(
            Dataset::parse_csv(&bad_pixel)
                .unwrap_err()
                .contains("column 1")
        );
        let bad_label = good.replace(",3", ",10");
        assert!(
            Dataset::parse_csv(&bad_label)
                .unwrap_err()
                .contains("label `10`")
        );
    }

    #[test]
    fn the_split_matches_digits_mlp_sizes() {
        let data = shipped();
        assert_eq!(data.len(), 1797);
        let (train, val) = data.stratified_split(VALIDATION_FRACTION, SPLIT_SEED);
        assert_eq!((train.len(), val.len()), (1438, 359));
        for (all, (t, v)) in data
            .class_counts()
            .iter()
            .zip(train.class_counts().iter().zip(val.class_counts()))
        {
            assert_eq!(t + v, *all);
        }
    }
}
