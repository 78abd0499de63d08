//! A trainable that attacks the host's burn interface (`wit/burn.wit`), one
//! attack per trial, picked by the config's `attack`; and a benign mode
//! that trains on the host, to check that its neighbours leave it alone.
//!
//! Forged frames name tensor ids far above any the burn client would give,
//! so they never collide with the client's own. Each attack's `train()`
//! returns the host's answer as its error, or keeps going until the host
//! stops it.
//!
//! | attack          | what it sends                                    | what the host must do        |
//! |-----------------|--------------------------------------------------|------------------------------|
//! | `benign`        | a least-squares fit through burn's API           | run it, ending TERMINATED    |
//! | `foreign`       | an operation on a tensor it never made           | refuse it, by id             |
//! | `after-free`    | an operation after the use that freed its input  | refuse it                    |
//! | `overflow`      | a tensor whose element count overflows           | refuse it before allocating  |
//! | `gigantic`      | a tensor far past the trial's quota              | refuse it before allocating  |
//! | `garbage`       | bytes that are no command                        | refuse the frame             |
//! | `ignore-errors` | more work after a refusal, never reading it      | run nothing more             |
//! | `fuel`          | matmuls forever, never reading                   | end it out of fuel           |
//! | `stall`         | more queued work than the call's deadline allows | kill its worker at it        |

use burn::tensor::{Device, Tensor};
use burn_ir::{BaseOperationIr, CreationOpIr, NumericOperationIr, OperationIr};
use burn_ir::{TensorId, TensorIr, TensorStatus, UnaryOpIr};
use burn_remote::wire::{Command, Frame};
use burn_std::{DType, Shape, TensorData};
use serde::Deserialize;
use wtune_guest::{Error, Report, Result, Trainable};

/// The trial's config.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Which attack (see the table above).
    pub attack: String,
}

/// Ids no burn client of this size would reach.
const FORGED: u64 = 1 << 40;

fn tensor(id: u64, shape: &[usize], status: TensorStatus) -> TensorIr {
    TensorIr {
        id: TensorId::new(FORGED + id),
        shape: Shape::from(shape.to_vec()),
        status,
        dtype: DType::F32,
    }
}

fn data(id: u64, shape: &[usize]) -> Command {
    let n: usize = shape.iter().product();
    Command::Data {
        id: TensorId::new(FORGED + id),
        data: TensorData::new(vec![1.0f32; n], shape.to_vec()),
    }
}

fn neg(input: TensorIr, out: TensorIr) -> Command {
    Command::Operation(OperationIr::NumericFloat(
        DType::F32,
        NumericOperationIr::Neg(UnaryOpIr { input, out }),
    ))
}

fn zeros(out: TensorIr) -> Command {
    Command::Operation(OperationIr::BaseFloat(BaseOperationIr::Zeros(
        CreationOpIr { out },
    )))
}

fn frame(commands: impl IntoIterator<Item = Command>) -> Vec<u8> {
    let mut frame = Frame::new();
    for command in commands {
        frame.push(&command);
    }
    frame.bytes().to_vec()
}

/// Sends `commands`, then asks the host how it went.
fn forge(commands: impl IntoIterator<Item = Command>) -> Result<()> {
    wtune_guest::burn::submit(&frame(commands));
    wtune_guest::burn::sync(&[]).map_err(|why| Error::msg(format!("the host said: {why}")))
}

fn host() -> Device {
    Device::new(burn_remote::host())
}

/// The trainable: the attack, and the benign fit's state.
pub struct BurnHostile {
    attack: String,
    weights: Option<Tensor<2>>,
    step: u32,
}

impl BurnHostile {
    /// One gradient step of least squares toward y = 2x, on the host.
    fn fit(&mut self) -> Result<f64> {
        let device = host();
        let x = Tensor::<2>::from_data(
            TensorData::new((0..64).map(|i| i as f32 / 64.0).collect(), [64, 1]),
            &device,
        );
        let y = x.clone() * 2.0;
        let w = self
            .weights
            .take()
            .unwrap_or_else(|| Tensor::<2>::zeros([1, 1], &device));
        let error = x.clone().matmul(w.clone()) - y;
        let gradient = x.transpose().matmul(error.clone()) / 32.0;
        self.weights = Some(w - gradient);
        let loss: f32 = (error.clone() * error)
            .mean()
            .try_into_scalar()
            .map_err(|e| Error::msg(format!("burn: {e}")))?;
        Ok(f64::from(loss))
    }
}

impl Trainable for BurnHostile {
    type Config = Config;

    fn setup(config: Config) -> Result<Self> {
        Ok(Self {
            attack: config.attack,
            weights: None,
            step: 0,
        })
    }

    fn train(&mut self) -> Result<Report> {
        self.step += 1;
        match self.attack.as_str() {
            "benign" => {
                let loss = self.fit()?;
                return Ok(Report::new().metric("loss", loss).done(self.step >= 5));
            }
            "foreign" => forge([neg(
                tensor(7, &[2], TensorStatus::ReadOnly),
                tensor(8, &[2], TensorStatus::NotInit),
            )])?,
            "after-free" => forge([
                data(1, &[2]),
                neg(
                    tensor(1, &[2], TensorStatus::ReadWrite),
                    tensor(2, &[2], TensorStatus::NotInit),
                ),
                neg(
                    tensor(1, &[2], TensorStatus::ReadOnly),
                    tensor(3, &[2], TensorStatus::NotInit),
                ),
            ])?,
            "overflow" => forge([zeros(tensor(
                1,
                &[1 << 30, 1 << 30, 1 << 30, 1 << 30],
                TensorStatus::NotInit,
            ))])?,
            "gigantic" => forge([zeros(tensor(1, &[1 << 20, 1 << 20], TensorStatus::NotInit))])?,
            "garbage" => {
                wtune_guest::burn::submit(&[0xff; 32]);
                wtune_guest::burn::sync(&[])
                    .map_err(|why| Error::msg(format!("the host said: {why}")))?
            }
            "ignore-errors" => {
                // Refused, and never asked about: the guest goes on as if
                // nothing happened, then reads through burn's API.
                wtune_guest::burn::submit(&frame([neg(
                    tensor(7, &[2], TensorStatus::ReadOnly),
                    tensor(8, &[2], TensorStatus::NotInit),
                )]));
                self.fit()?;
            }
            "fuel" => {
                let device = host();
                let x = Tensor::<2>::ones([256, 256], &device);
                loop {
                    // Never read: only the host's charge can stop this.
                    let _ = x.clone().matmul(x.clone());
                }
            }
            "stall" => {
                // Queued without waiting, then one read: that wait outlasts
                // the call's deadline.
                let device = host();
                let x = Tensor::<2>::ones([1024, 1024], &device);
                for _ in 0..400 {
                    let _ = x.clone().matmul(x.clone());
                }
                x.sum()
                    .try_into_scalar::<f32>()
                    .map_err(|e| Error::msg(format!("burn: {e}")))?;
            }
            other => return Err(Error::msg(format!("unknown attack {other:?}"))),
        }
        Ok(Report::new().metric("loss", 0.0))
    }
}

wtune_guest::export!(BurnHostile);
