//! The host side of the `wtune:trainable/burn` interface: the guest's
//! frames go to the trial's burn worker through its compute session, which
//! settles their fuel with the store like any host compute (see
//! [`super::compute::settle`]).

use super::bindings::wtune::trainable::burn as wit;
use super::store_data::TrialHost;

impl wit::Host for TrialHost {
    fn submit(&mut self, frame: Vec<u8>) {
        self.compute.burn_submit(&frame);
    }

    fn read(&mut self, frame: Vec<u8>, tensor: Vec<u8>) -> Result<Vec<u8>, String> {
        self.compute.burn_read(&frame, &tensor)
    }

    fn sync(&mut self, frame: Vec<u8>) -> Result<(), String> {
        self.compute.burn_sync(&frame)
    }
}
