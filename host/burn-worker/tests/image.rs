//! A session as bytes, for the host's snapshots: a restored session holds
//! the same tensors and draws the same random numbers next; forged or
//! misplaced images are refused with the reason.
//!
//! burn-flex's random generator is global to the process, so these tests
//! live in a binary of their own and take turns.

mod common;

use std::sync::Mutex;

use burn_ir::{OperationIr, TensorStatus};
use burn_remote::wire::Command;
use burn_std::Distribution;
use common::{data, frame, random, tensor, values};
use wtune_burn_worker::{Session, Usage};

static SERIAL: Mutex<()> = Mutex::new(());

const QUOTA: u64 = 1 << 20;

/// Dropout's draw.
const DRAW: Distribution = Distribution::Bernoulli(0.5);

#[test]
fn a_restored_session_holds_the_tensors_and_draws_what_the_original_draws_next() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut original = Session::new(QUOTA, u64::MAX);
    original.run(&frame([
        data(1, vec![1.0, 2.0, 3.0]),
        Command::Seed(7),
        random(2, 64, DRAW),
        random(3, 64, DRAW),
        random(4, 32, DRAW),
    ]));
    assert_eq!(original.error(), None);
    let image = original.image().expect("an image");
    let held = original.usage();
    let kept: Vec<Vec<f32>> = [(1, 3), (2, 64), (4, 32)]
        .iter()
        .map(|&(id, n)| values(&mut original, id, n))
        .collect();
    original.run(&frame([random(5, 256, DRAW)]));
    let next = values(&mut original, 5, 256);

    let mut restored = Session::new(QUOTA, u64::MAX);
    restored.restore(&image).expect("the restore");
    assert_eq!(restored.usage(), held);
    let got: Vec<Vec<f32>> = [(1, 3), (2, 64), (4, 32)]
        .iter()
        .map(|&(id, n)| values(&mut restored, id, n))
        .collect();
    assert_eq!(got, kept);
    restored.run(&frame([random(5, 256, DRAW)]));
    assert_eq!(values(&mut restored, 5, 256), next);
    // A mask of 256 fair coins that repeats by chance is no test at all.
    assert!(next.contains(&0.0) && next.contains(&1.0));
}

#[test]
fn images_are_refused_by_sessions_that_ran_and_when_forged() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut original = Session::new(QUOTA, u64::MAX);
    original.run(&frame([data(1, vec![0.5; 1000])]));
    let image = original.image().unwrap();

    let mut busy = Session::new(QUOTA, u64::MAX);
    busy.run(&frame([data(9, vec![1.0])]));
    assert_eq!(
        busy.restore(&image),
        Err("restoring a snapshot: the session has run commands already".into())
    );

    let mut fresh = Session::new(QUOTA, u64::MAX);
    let error = fresh.restore(&image[..image.len() / 2]).unwrap_err();
    assert!(
        error.starts_with("restoring a snapshot: its data does not decode"),
        "{error}"
    );
    // The failure is the session's, as any other.
    assert_eq!(fresh.sync(&[]), Err(error));

    // An image that does not fit this session's quota.
    let mut small = Session::new(1000, u64::MAX);
    let error = small.restore(&image).unwrap_err();
    assert!(error.contains("over its quota of 1000"), "{error}");
    assert_eq!(small.usage(), Usage::default());

    // A failed session has no exact state to give.
    let mut failed = Session::new(QUOTA, u64::MAX);
    failed.run(&[0xff, 0xff]);
    let error = failed.image().unwrap_err();
    assert!(error.contains("does not decode"), "{error}");
}

#[test]
fn past_its_bounds_the_record_starts_over_alike_in_the_original_and_the_restored() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut original = Session::new(QUOTA, u64::MAX);
    original.run(&frame([Command::Seed(11)]));
    // Draws of two kinds in turn make a run each: enough to pass the bound
    // on runs, with the bound reached between two snapshots.
    let runs = wtune_burn_worker::MAX_DRAW_RUNS as u64;
    let mut id = 100;
    let draw = |session: &mut Session, id: &mut u64, n: usize| {
        *id += 1;
        session.run(&frame([
            random(*id, n, DRAW),
            Command::Operation(OperationIr::Drop(tensor(
                *id,
                &[n],
                TensorStatus::ReadWrite,
            ))),
        ]));
    };
    for i in 0..runs - 10 {
        draw(&mut original, &mut id, 1 + (i % 2) as usize);
    }
    assert_eq!(original.error(), None);
    let image = original.image().unwrap();
    assert!(image.len() < 4 << 20, "{} bytes", image.len());
    // The generator is the process's: the original goes on first, then
    // the restored session takes its place.
    let start = id;
    for i in 0..20 {
        draw(&mut original, &mut id, 1 + (i % 2) as usize);
    }
    original.run(&frame([random(1, 256, DRAW)]));
    let expected = values(&mut original, 1, 256);
    let mut restored = Session::new(QUOTA, u64::MAX);
    restored.restore(&image).unwrap();
    let mut id = start;
    for i in 0..20 {
        draw(&mut restored, &mut id, 1 + (i % 2) as usize);
    }
    restored.run(&frame([random(1, 256, DRAW)]));
    assert_eq!(values(&mut restored, 1, 256), expected);
}

#[test]
fn a_trial_holds_at_most_so_many_tensors() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut session = Session::new(QUOTA, u64::MAX);
    let most = wtune_burn_worker::ledger::MAX_TENSORS as u64;
    session.run(&frame((0..most).map(|id| data(id, Vec::new()))));
    assert_eq!(session.error(), None);
    session.run(&frame([data(most, Vec::new())]));
    let error = session.error().unwrap();
    assert!(
        error.ends_with("the trial holds 65536 tensors, and 1 more would pass the 65536 the host keeps for one trial"),
        "{error}"
    );
}
