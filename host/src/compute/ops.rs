//! The kernels a trainable can ask for, as plain data. The sandbox layer
//! converts the WIT types into these, so the kernels know nothing of wasm.

use serde::{Deserialize, Serialize};

/// Element-wise function of one input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unary {
    Relu,
    Sigmoid,
    Tanh,
    Exp,
    Log,
    Neg,
    Abs,
    Sqrt,
    Square,
    Recip,
}

impl Unary {
    /// The function itself.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Unary::Relu => x.max(0.0),
            Unary::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Unary::Tanh => x.tanh(),
            Unary::Exp => x.exp(),
            Unary::Log => x.ln(),
            Unary::Neg => -x,
            Unary::Abs => x.abs(),
            Unary::Sqrt => x.sqrt(),
            Unary::Square => x * x,
            Unary::Recip => 1.0 / x,
        }
    }

    /// Rough cost in floating-point operations, for fuel: transcendental
    /// functions take tens of instructions, the rest one or two.
    pub fn flops(self) -> u64 {
        match self {
            Unary::Sigmoid | Unary::Tanh | Unary::Exp | Unary::Log => 20,
            Unary::Sqrt | Unary::Recip => 4,
            _ => 1,
        }
    }
}

/// Element-wise function of two inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    /// `a` where `b > 0`, else 0.
    ReluBackward,
}

impl Binary {
    /// The function itself.
    #[inline]
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            Binary::Add => a + b,
            Binary::Sub => a - b,
            Binary::Mul => a * b,
            Binary::Div => a / b,
            Binary::Max => a.max(b),
            Binary::Min => a.min(b),
            Binary::ReluBackward => {
                if b > 0.0 {
                    a
                } else {
                    0.0
                }
            }
        }
    }
}

/// How a reduction combines values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reduce {
    Sum,
    Mean,
    Max,
    Min,
}

/// Which way a reduction runs over a row-major matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Axis {
    /// One result per row.
    Rows,
    /// One result per column.
    Cols,
}

/// `out = alpha * op(a) * op(b) + beta * out`, row-major, `op(a)` is
/// `m x k` and `op(b)` is `k x n`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Matmul {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// `a` is stored `k x m`.
    pub transpose_a: bool,
    /// `b` is stored `n x k`.
    pub transpose_b: bool,
    #[serde(with = "f32_bits")]
    pub alpha: f32,
    #[serde(with = "f32_bits")]
    pub beta: f32,
}

impl Matmul {
    /// Multiply-adds count twice.
    pub fn flops(&self) -> u64 {
        2 * self.m as u64 * self.n as u64 * self.k as u64
    }
}

/// An `f32` as its bits, so NaN and infinities survive formats (JSON) that
/// have no words for them.
pub mod f32_bits {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the bits.
    pub fn serialize<S: Serializer>(value: &f32, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u32(value.to_bits())
    }

    /// Reads the bits.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f32, D::Error> {
        u32::deserialize(deserializer).map(f32::from_bits)
    }
}
