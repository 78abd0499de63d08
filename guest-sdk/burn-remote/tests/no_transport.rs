//! A program that never installed a transport (a guest run outside wtune)
//! gets an error that says so, at its first read.

use burn::tensor::{Device, Tensor};
use burn_remote::RemoteDevice;

#[test]
fn reading_without_a_host_says_what_is_missing() {
    let device = Device::new(RemoteDevice);
    let x = Tensor::<2>::ones([2, 2], &device) * 3.0;
    let error = x.clone().try_into_data().unwrap_err().to_string();
    assert!(
        error.contains("none is connected: run this guest under wtune"),
        "{error}"
    );
    // Later reads say the same; nothing was queued behind the guest's back.
    let error = x.sum().try_into_data().unwrap_err().to_string();
    assert!(error.contains("none is connected"), "{error}");
}
