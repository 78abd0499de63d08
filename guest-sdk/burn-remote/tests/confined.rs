//! The CNN trains bit-identically when its operations run in a real,
//! confined `wtune-burn-worker` process: the system call filter leaves
//! every kernel of the forward pass, autodiff and Adam what it needs.

mod common;

use common::cnn::train;
use common::{local, remote};

#[test]
fn a_cnn_trains_bit_identically_in_a_confined_worker() {
    common::worker::install();
    let sent = train(&remote(), 3);
    let kept = train(&local(), 3);
    assert_eq!(sent, kept);
}
