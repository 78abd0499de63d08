//! The model the agreement tests train on each side.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Distribution, Int, Tensor, TensorData};

use super::cases::drawn;

/// A CNN like the digits example's: convolutions, max pooling, dropout
/// and linear layers, on 8x8 single-channel images.
#[derive(Module, Debug)]
pub struct Cnn {
    conv1: Conv2d,
    conv2: Conv2d,
    pool: MaxPool2d,
    dropout: Dropout,
    fc1: Linear,
    fc2: Linear,
}

impl Cnn {
    fn new(device: &Device, dropout: f64) -> Self {
        let conv = |from, to| {
            Conv2dConfig::new([from, to], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device)
        };
        Self {
            conv1: conv(1, 4),
            conv2: conv(4, 8),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            dropout: DropoutConfig::new(dropout).init(),
            fc1: LinearConfig::new(8 * 16, 32).init(device),
            fc2: LinearConfig::new(32, 10).init(device),
        }
    }

    fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        let x = relu(self.conv1.forward(images));
        let x = relu(self.conv2.forward(x));
        let x = self.dropout.forward(self.pool.forward(x));
        let x: Tensor<2> = x.flatten(1, 3);
        self.fc2.forward(relu(self.fc1.forward(x)))
    }
}

/// Seeds `device`, builds the CNN, takes `steps` Adam steps on a fixed
/// batch; returns each step's loss and the trained weights.
pub fn train(device: &Device, steps: usize) -> (Vec<TensorData>, Vec<TensorData>) {
    train_drawn(device, device, 0.25, steps)
}

/// [`train`] with the weights and the batch drawn on `draw` (seeded)
/// and moved to `device`, and dropout `dropout`: without dropout, the
/// training draws nothing on `device`, so a device whose generator
/// differs trains the same model on the same batch.
pub fn train_drawn(
    device: &Device,
    draw: &Device,
    dropout: f64,
    steps: usize,
) -> (Vec<TensorData>, Vec<TensorData>) {
    draw.seed(7);
    let mut model = drawn(Cnn::new(draw, dropout)).fork(device);
    let mut optim = AdamConfig::new().init();
    let images = Tensor::<4>::random([16, 1, 8, 8], Distribution::Uniform(0.0, 1.0), draw)
        .to_device(device)
        .detach();
    let labels =
        Tensor::<1, Int>::from_ints([0, 7, 4, 1, 8, 5, 2, 9, 6, 3, 0, 7, 4, 1, 8, 5], device);
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut losses = Vec::new();
    for _ in 0..steps {
        let loss = loss_fn.forward(model.forward(images.clone()), labels.clone());
        losses.push(loss.clone().into_data());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
    }
    let weights = vec![
        model.conv1.weight.val().into_data(),
        model.conv2.bias.as_ref().expect("bias").val().into_data(),
        model.fc1.weight.val().into_data(),
        model.fc2.weight.val().into_data(),
    ];
    (losses, weights)
}
