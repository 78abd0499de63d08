//! The network: a two-convolution CNN for 8x8 single-channel images.
//!
//! ```text
//! [n,1,8,8] -conv3x3-> [n,c1,8,8] -relu-conv3x3-> [n,c2,8,8] -relu-maxpool2-> [n,c2,4,4]
//!   -dropout-flatten-> [n,c2*16] -linear-relu-dropout-> [n,hidden] -linear-> [n,10]
//! ```
//!
//! burn 0.22 tensors carry their backend in their `Device` rather than in a
//! type parameter, so the module has no generics: the same `Cnn` trains on
//! `Device::flex().autodiff()` and evaluates after `Module::valid()`.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};

use crate::data::{CLASSES, SIDE};

/// Spatial cells left after the 2x2 max pool: (8/2)^2.
const POOLED: usize = (SIDE / 2) * (SIDE / 2);

/// Forces every lazily initialised parameter to draw its values now.
///
/// burn 0.22 parameters are lazy: `init` only records how to fill them and
/// the random draw happens at first use. Drawing right after the RNG is
/// seeded makes the initial weights depend on the seed alone, not on
/// whatever else drew from burn's process-global RNG in between.
struct Materialize;

impl ModuleVisitor for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let _ = param.val();
    }
}

/// The hyperparameters that shape the weights. Changing any of them makes a
/// different network, which is why `reset` refuses such a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Architecture {
    /// Channels of the first convolution (`c1`); the second has `2 * c1`.
    pub channels: usize,
    /// Width of the hidden fully connected layer.
    pub hidden: usize,
}

/// The CNN. `Module` derives parameter traversal (for gradients, the
/// optimizer and `valid()`); both dropout sites share one probability.
#[derive(Module, Debug)]
pub struct Cnn {
    conv1: Conv2d,
    conv2: Conv2d,
    pool: MaxPool2d,
    dropout_conv: Dropout,
    fc1: Linear,
    dropout_fc: Dropout,
    fc2: Linear,
}

impl Cnn {
    /// A freshly initialised network on `device` (burn's default Kaiming
    /// uniform init, drawn from the device's seeded RNG). `dropout` must be
    /// in `[0, 1)`: burn panics otherwise, so the config is validated first.
    pub fn new(arch: Architecture, dropout: f64, device: &Device) -> Self {
        let c1 = arch.channels;
        let c2 = 2 * c1;
        let conv = |from, to| {
            Conv2dConfig::new([from, to], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device)
        };
        let model = Self {
            conv1: conv(1, c1),
            conv2: conv(c1, c2),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            dropout_conv: DropoutConfig::new(dropout).init(),
            fc1: LinearConfig::new(c2 * POOLED, arch.hidden).init(device),
            dropout_fc: DropoutConfig::new(dropout).init(),
            fc2: LinearConfig::new(arch.hidden, CLASSES).init(device),
        };
        model.visit(&mut Materialize);
        model
    }

    /// Logits `[n, 10]` for images `[n, 1, 8, 8]`. Dropout is active only on
    /// an autodiff device and outside `valid()`, which burn's `Dropout`
    /// checks itself.
    pub fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        let x = relu(self.conv1.forward(images));
        let x = relu(self.conv2.forward(x));
        let x = self.dropout_conv.forward(self.pool.forward(x));
        let x: Tensor<2> = x.flatten(1, 3);
        let x = self.dropout_fc.forward(relu(self.fc1.forward(x)));
        self.fc2.forward(x)
    }

    /// Switches both dropout layers to probability `p` (in `[0, 1)`),
    /// keeping the weights: dropout has no parameters, only this field.
    pub fn set_dropout(&mut self, p: f64) {
        self.dropout_conv.prob = p;
        self.dropout_fc.prob = p;
    }
}
