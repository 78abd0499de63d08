//! The device burn's dispatch knows as `Remote`.

use burn_backend::{DType, DeviceId, DeviceOps};
use burn_std::{DeviceSettings, QuantConfig, QuantScheme, QuantStore};

/// The wtune host's compute, as a burn device. There is one per guest: the
/// host decides which of its backends (CPU or GPU) runs the operations.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq, Hash)]
pub struct RemoteDevice;

impl burn_std::device::Device for RemoteDevice {
    fn from_id(_: DeviceId) -> Self {
        RemoteDevice
    }

    fn to_id(&self) -> DeviceId {
        // burn's dispatch packs the type id into 8 bits.
        DeviceId::new(0, 0)
    }
}

impl DeviceOps for RemoteDevice {
    /// The element types tensors get when the model names none: f32 and
    /// i32, which every backend of the host supports, and bools as the
    /// host's backend stores them ([`crate::Transport::bools`]).
    fn defaults(&self) -> DeviceSettings {
        let quantization = QuantScheme::default().with_store(QuantStore::Native);
        DeviceSettings::new(
            DType::F32,
            DType::I32,
            DType::Bool(crate::transport::bools()),
            QuantConfig::new(quantization, Default::default()),
        )
    }
}
