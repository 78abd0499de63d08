//! The wtune host as this crate's [`Transport`] (feature `guest`): a
//! trainable's burn operations go to the host's `wtune:trainable/burn`
//! interface through `wtune_guest::burn`.

use std::sync::{Once, OnceLock};

use burn_ir::TensorIr;
use burn_std::{BoolStore, ExecutionError, TensorData};

use crate::{RemoteDevice, Transport};

/// The host's burn interface.
struct WtuneHost;

impl Transport for WtuneHost {
    fn submit(&self, frame: &[u8]) {
        wtune_guest::burn::submit(frame);
    }

    fn read(&self, frame: &[u8], tensor: TensorIr) -> Result<TensorData, ExecutionError> {
        let tensor = postcard::to_allocvec(&tensor)
            .map_err(|e| ExecutionError::generic(format!("encoding a tensor to read: {e}")))?;
        let data = wtune_guest::burn::read(frame, &tensor).map_err(ExecutionError::generic)?;
        postcard::from_bytes(&data).map_err(|e| {
            ExecutionError::generic(format!("the host's tensor data does not decode: {e}"))
        })
    }

    fn sync(&self, frame: &[u8]) -> Result<(), ExecutionError> {
        wtune_guest::burn::sync(frame).map_err(ExecutionError::generic)
    }

    /// The host runs a trial's burn operations where its compute runs:
    /// on a GPU there, bools are 32-bit words.
    fn bools(&self) -> BoolStore {
        static BOOLS: OnceLock<BoolStore> = OnceLock::new();
        *BOOLS.get_or_init(|| match wtune_guest::compute::info().kind.as_str() {
            "gpu" => BoolStore::U32,
            _ => BoolStore::Native,
        })
    }
}

/// The wtune host's compute as a burn device, for a trainable running in
/// wtune: `burn::tensor::Device::new(burn_remote::host())`. The first call
/// connects this guest's burn client to the host; a transport installed
/// before it (a test's) stays.
pub fn host() -> RemoteDevice {
    static CONNECT: Once = Once::new();
    CONNECT.call_once(|| {
        crate::install(WtuneHost);
    });
    RemoteDevice
}
