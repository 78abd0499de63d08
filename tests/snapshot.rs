//! Host snapshots: a trial's state is captured between calls without the
//! guest's help, and a fresh instance restored from it continues bit for bit
//! as the original did, with its stdout and data directories still working.

mod common;

use serde_json::{Value, json};
use wtune::sandbox::{GuestReport, Limits, Program, SnapshotError, TrialEnv, TrialInstance};
use wtune::snapshot::{
    self, FormatError, GuestImage, Payload, ReadError, SnapshotMeta, instrument,
};

fn started(program: &Program, env: &TrialEnv, config: &Value) -> TrialInstance {
    let mut instance = program.instantiate(env, &Limits::default()).unwrap();
    instance.setup(&config.to_string()).unwrap();
    instance
}

fn train(instance: &mut TrialInstance, calls: usize) -> Vec<GuestReport> {
    (0..calls).map(|_| instance.train().unwrap().0).collect()
}

#[test]
fn instrumented_components_are_valid() {
    for name in ["digits_mlp", "hostile", "stateful"] {
        let bytes = std::fs::read(common::guest(name)).unwrap();
        let instrumented = instrument(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
            .validate_all(&instrumented.bytes)
            .unwrap_or_else(|e| panic!("{name}: instrumented component is invalid: {e}"));
        assert!(!instrumented.layout.memories.is_empty(), "{name}");
        assert!(!instrumented.layout.globals.is_empty(), "{name}");
    }
}

#[test]
fn a_restored_instance_continues_bit_exactly_and_keeps_its_handles() {
    let program = common::load("stateful");
    program.snapshots().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let env = common::trial_env(dir.path(), vec![]);
    let config = json!({"seed": 11, "buffer_kib": 512, "print": true, "read_data": true});

    let mut original = started(&program, &env, &config);
    train(&mut original, 3);
    let image = original.snapshot().unwrap();
    assert!(image.stored_bytes() > 512 << 10, "the buffer is stored");
    let expected = train(&mut original, 4);
    original.flush_logs();

    let restored_dir = dir.path().join("restored");
    std::fs::create_dir_all(&restored_dir).unwrap();
    let restored_env = TrialEnv {
        log_dir: restored_dir.clone(),
        ..env.clone()
    };
    let mut restored = program
        .restore(&restored_env, &Limits::default(), &image, 3, 0)
        .unwrap();
    assert_eq!(restored.iterations(), 3);
    // Nothing the guest can observe differs from the original at the
    // moment of the snapshot.
    assert_eq!(restored.snapshot().unwrap(), image);
    let continued = train(&mut restored, 4);
    assert_eq!(continued, expected);
    assert!(
        continued
            .iter()
            .all(|r| r.metrics.iter().any(|(n, _)| n == "data_bytes"))
    );
    restored.flush_logs();
    let stdout = std::fs::read_to_string(restored_dir.join("stdout.log")).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(lines[0].starts_with("call 4 digest "), "{stdout}");
}

#[test]
fn the_digits_model_resumes_with_identical_metrics() {
    let program = common::load("digits_mlp");
    let dir = tempfile::tempdir().unwrap();
    let data = vec![(
        "digits".to_string(),
        common::workspace().join("examples/digits-mlp/data"),
    )];
    let env = common::trial_env(dir.path(), data);
    let config = json!({"lr": 0.05, "hidden": 32, "batch_size": 32, "seed": 3});
    let mut original = started(&program, &env, &config);
    train(&mut original, 2);
    let image = original.snapshot().unwrap();
    let expected = train(&mut original, 2);
    let mut restored = program
        .restore(&env, &Limits::default(), &image, 2, 0)
        .unwrap();
    assert_eq!(train(&mut restored, 2), expected);
}

#[test]
fn a_file_held_open_across_calls_is_refused_with_the_cause() {
    let program = common::load("stateful");
    let dir = tempfile::tempdir().unwrap();
    let env = common::trial_env(dir.path(), vec![]);
    let mut instance = started(&program, &env, &json!({"hold_file": true}));
    train(&mut instance, 1);
    let err = instance.snapshot().unwrap_err();
    assert!(matches!(err, SnapshotError::Inexact(_)), "{err}");
    assert!(err.to_string().contains("handle"), "{err}");
    // The refusal costs the trial nothing.
    train(&mut instance, 1);
}

#[test]
fn a_trapped_instance_cannot_be_snapshotted() {
    let program = common::load("stateful");
    let dir = tempfile::tempdir().unwrap();
    let env = common::trial_env(dir.path(), vec![]);
    let mut instance = started(&program, &env, &json!({"trap_at": 1}));
    assert!(instance.train().is_err());
    assert_eq!(instance.snapshot().unwrap_err(), SnapshotError::Poisoned);
}

#[test]
fn an_image_that_does_not_fit_is_rejected() {
    let program = common::load("stateful");
    let dir = tempfile::tempdir().unwrap();
    let env = common::trial_env(dir.path(), vec![]);
    let mut instance = started(&program, &env, &json!({}));
    let image = instance.snapshot().unwrap();

    let mut missing = image.clone();
    missing.memories.pop();
    let err = program
        .restore(&env, &Limits::default(), &missing, 0, 0)
        .err()
        .unwrap();
    assert!(matches!(err, SnapshotError::Mismatch(_)), "{err}");

    let mut overlong = image.clone();
    overlong.memories[0].runs.push((u64::MAX - 5, 10));
    let err = program
        .restore(&env, &Limits::default(), &overlong, 0, 0)
        .err()
        .unwrap();
    assert!(matches!(err, SnapshotError::Mismatch(_)), "{err}");
}

#[test]
fn a_restore_beyond_the_memory_limit_fails_clearly() {
    let program = common::load("stateful");
    let dir = tempfile::tempdir().unwrap();
    let env = common::trial_env(dir.path(), vec![]);
    let mut instance = started(&program, &env, &json!({"buffer_kib": 8192}));
    let image: GuestImage = instance.snapshot().unwrap();
    let small = Limits {
        memory_bytes: 4 << 20,
        ..Limits::default()
    };
    let err = program.restore(&env, &small, &image, 0, 0).err().unwrap();
    assert!(err.to_string().contains("memory"), "{err}");
}

#[test]
fn a_snapshot_file_resumes_the_trial_and_rejects_other_components() {
    let program = common::load("stateful");
    let dir = tempfile::tempdir().unwrap();
    let env = common::trial_env(dir.path(), vec![]);
    let config = json!({"seed": 5, "buffer_kib": 4096, "print": true});
    let mut original = started(&program, &env, &config);
    train(&mut original, 2);
    let image = original.snapshot().unwrap();
    let meta = SnapshotMeta {
        component: program.digest().to_string(),
        trial_id: "trial_0000".into(),
        config: config.clone(),
        iteration: original.iterations(),
        fuel_total: original.fuel_total(),
        time_total_s: 0.0,
        result: Value::Null,
    };
    let path = dir.path().join("checkpoint.wtsnap");
    let image = Payload::Memory(image);
    let written = snapshot::write(&path, &meta, &image, None).unwrap();
    let Payload::Memory(image) = image else {
        unreachable!()
    };
    // 4 MiB of live, random heap compresses little; the rest of a memory of
    // that size is never stored.
    assert!(written < image.memory_bytes(), "{written}");
    let expected = train(&mut original, 3);

    let (read_meta, read_image) = snapshot::read(&path, program.digest(), None).unwrap();
    assert_eq!(read_meta, meta);
    let Payload::Memory(read_image) = read_image else {
        panic!("a memory snapshot was written")
    };
    let mut resumed = program
        .restore(
            &env,
            &Limits::default(),
            &read_image,
            read_meta.iteration,
            read_meta.fuel_total,
        )
        .unwrap();
    assert_eq!(resumed.fuel_total(), meta.fuel_total);
    assert_eq!(train(&mut resumed, 3), expected);

    let other = common::load("hostile");
    match snapshot::read(&path, other.digest(), None) {
        Err(ReadError::Format(FormatError::Foreign { .. })) => {}
        other => panic!("expected a foreign-component error, got {other:?}"),
    }
}

#[test]
fn a_snapshot_taken_straight_into_a_file_holds_the_same_state() {
    let program = common::load("stateful");
    let dir = tempfile::tempdir().unwrap();
    let env = common::trial_env(dir.path(), vec![]);
    let config = json!({"seed": 9, "buffer_kib": 2048, "print": true, "read_data": true});
    let mut instance = started(&program, &env, &config);
    train(&mut instance, 2);
    let image = instance.snapshot().unwrap();

    let checkpoints = dir.path().join("checkpoints");
    std::fs::create_dir_all(&checkpoints).unwrap();
    let path = checkpoints.join("checkpoint.wtsnap");
    let spool = snapshot::Spool::beside(&path).unwrap();
    let (layout, spool) = instance.snapshot_into(spool).unwrap();
    // The layout names the same runs but holds none of their bytes.
    assert_eq!(layout.memories.len(), image.memories.len());
    for (spooled, kept) in layout.memories.iter().zip(&image.memories) {
        assert_eq!(spooled.runs, kept.runs);
        assert!(spooled.data.is_empty());
    }
    assert_eq!(layout.globals, image.globals);
    let meta = SnapshotMeta {
        component: program.digest().to_string(),
        trial_id: "trial_0000".into(),
        config: config.clone(),
        iteration: instance.iterations(),
        fuel_total: instance.fuel_total(),
        time_total_s: 0.0,
        result: Value::Null,
    };
    let written = snapshot::write_spooled(&path, &meta, &layout, spool, None).unwrap();
    assert_eq!(written, std::fs::metadata(&path).unwrap().len());
    // Only the snapshot is left: the spool had no name.
    let names: Vec<_> = std::fs::read_dir(&checkpoints)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["checkpoint.wtsnap"]);

    let (read_meta, read) = snapshot::read(&path, program.digest(), None).unwrap();
    assert_eq!(read_meta, meta);
    let Payload::Memory(read) = read else {
        panic!("a memory snapshot was written")
    };
    // Compared piecewise: a failure would print megabytes of memory. (A
    // snapshot without compute buffers records no buffer counters.)
    assert!(read.memories == image.memories, "the memories differ");
    assert_eq!(read.globals, image.globals);
    assert_eq!(read.compute.buffers, image.compute.buffers);
    // And the instance goes on: taking a snapshot changed nothing.
    assert_eq!(instance.iterations(), 2);
    train(&mut instance, 1);
}
