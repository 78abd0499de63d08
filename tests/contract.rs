//! Components that are not trainables are refused before anything runs,
//! with an error that says what is wrong.

mod common;

use wtune::sandbox::ContractError;

fn load_error(bytes: &[u8]) -> ContractError {
    match common::sandbox().load_bytes(bytes) {
        Ok(_) => panic!("should have been refused"),
        Err(e) => e,
    }
}

const SIX_WRONG_EXPORTS: &str = r#"
    (core module $m (func (export "f")))
    (core instance $i (instantiate $m))
    (func $f (canon lift (core func $i "f")))
    (export "setup" (func $f))
    (export "train" (func $f))
    (export "save" (func $f))
    (export "restore" (func $f))
    (export "reset" (func $f))
    (export "cleanup" (func $f))
"#;

#[test]
fn garbage_is_not_wasm() {
    let err = load_error(b"this is not wasm at all");
    assert!(matches!(err, ContractError::NotWasm { .. }));
    assert!(
        err.to_string().contains("not a WebAssembly binary"),
        "{err}"
    );
}

#[test]
fn a_core_module_is_refused_with_the_fix() {
    let bytes = wat::parse_str("(module (func (export \"train\")))").unwrap();
    let err = load_error(&bytes);
    assert_eq!(err, ContractError::CoreModule);
    assert!(
        err.to_string()
            .contains("cargo build --target wasm32-wasip2"),
        "{err}"
    );
}

#[test]
fn a_truncated_component_is_invalid() {
    let bytes = std::fs::read(common::guest("hostile")).unwrap();
    let err = load_error(&bytes[..bytes.len() / 2]);
    assert!(matches!(err, ContractError::Invalid { .. }), "{err}");
}

#[test]
fn a_component_of_another_world_names_the_missing_exports() {
    let bytes = wat::parse_str(
        r#"(component
            (core module $m (func (export "f")))
            (core instance $i (instantiate $m))
            (func $f (canon lift (core func $i "f")))
            (export "hello" (func $f)))"#,
    )
    .unwrap();
    let err = load_error(&bytes);
    let text = err.to_string();
    assert!(text.contains("wtune:trainable/trainable@0.1.0"), "{text}");
    for name in ["setup", "train", "save", "restore", "reset", "cleanup"] {
        assert!(
            text.contains(&format!("`{name}: func(")),
            "{name} missing from: {text}"
        );
    }
}

#[test]
fn exports_of_the_wrong_type_are_refused() {
    let bytes = wat::parse_str(format!("(component {SIX_WRONG_EXPORTS})")).unwrap();
    let err = load_error(&bytes);
    assert!(matches!(err, ContractError::ExportType { .. }), "{err}");
}

#[test]
fn imports_the_host_does_not_offer_are_named() {
    let bytes = wat::parse_str(format!(
        r#"(component
            (import "evil:net/sockets@1.0.0" (instance (export "open" (func))))
            {SIX_WRONG_EXPORTS})"#
    ))
    .unwrap();
    let err = load_error(&bytes);
    assert!(matches!(err, ContractError::Imports { .. }), "{err}");
    assert!(err.to_string().contains("evil:net/sockets@1.0.0"), "{err}");
}

#[test]
fn names_reserved_for_host_snapshots_are_refused() {
    // A guest must not reach the host's snapshot sink, nor pose as the
    // accessor the host calls.
    let bytes = wat::parse_str(format!(
        r#"(component
            (import "wtune:snapshot/sink" (instance (export "chunk" (func))))
            {SIX_WRONG_EXPORTS})"#
    ))
    .unwrap();
    let err = load_error(&bytes);
    assert!(matches!(err, ContractError::Imports { .. }), "{err}");
    assert!(err.to_string().contains("reserved"), "{err}");

    let bytes = wat::parse_str(format!(
        r#"(component
            {SIX_WRONG_EXPORTS}
            (instance $a (export "f" (func $f)))
            (export "wtune:snapshot/access" (instance $a)))"#
    ))
    .unwrap();
    let err = load_error(&bytes);
    assert!(err.to_string().contains("reserved"), "{err}");
}

#[test]
fn the_sdk_guests_fit_the_contract() {
    for guest in ["hostile", "digits_mlp"] {
        let bytes = std::fs::read(common::guest(guest)).unwrap();
        let description = common::sandbox().describe(&bytes).unwrap();
        assert_eq!(description.fits, Ok(()), "{guest}");
        let exports: Vec<&str> = description
            .exports
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(
            exports,
            ["setup", "train", "save", "restore", "reset", "cleanup"]
        );
        assert!(
            description
                .imports
                .iter()
                .any(|(n, _)| n == "wtune:trainable/host@0.1.0")
        );
    }
}

#[test]
fn inspect_into_a_closed_pipe_exits_quietly() {
    // `wtune inspect model.wasm | head -1`: the reader is gone before
    // wtune writes. The pipe's read end is closed before wtune starts, so
    // its first write meets the broken pipe every time.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = common::wtune()
        .arg("inspect")
        .arg(common::guest("digits_mlp"))
        .stdout(writer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn inspect_prints_the_contract_or_a_one_line_error() {
    let out = common::wtune()
        .arg("inspect")
        .arg(common::guest("digits_mlp"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("train: func() -> result<record { metrics: list<record { name: string, value: f64 }>, done: bool }, string>"), "{stdout}");
    assert!(
        stdout.contains("contract: fits wtune:trainable/trainable@0.1.0")
            && stdout.contains("host snapshots: supported"),
        "{stdout}"
    );

    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Vec<u8>, &str); 3] = [
        (
            "garbage.wasm",
            b"garbage".to_vec(),
            "not a WebAssembly binary",
        ),
        (
            "core.wasm",
            wat::parse_str("(module)").unwrap(),
            "core WebAssembly module, not a component",
        ),
        (
            "other.wasm",
            wat::parse_str("(component)").unwrap(),
            "missing exports",
        ),
    ];
    for (name, bytes, expected) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let out = common::wtune().arg("inspect").arg(&path).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(expected),
            "{name}: {stderr}"
        );
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    }
    let out = common::wtune()
        .arg("inspect")
        .arg(dir.path().join("missing.wasm"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));

    // An import's name is the component's own text, which may hold escape
    // sequences: they reach the operator's terminal inert.
    let path = dir.path().join("escapes.wasm");
    let wat = r#"(component (import "url=<x\1b]0;owned\07\1b[2J>" (func)))"#;
    std::fs::write(&path, wat::parse_str(wat).unwrap()).unwrap();
    let out = common::wtune().arg("inspect").arg(&path).output().unwrap();
    let (stdout, stderr) = (out.stdout.clone(), out.stderr.clone());
    assert!(
        !stdout.contains(&0x1b) && !stderr.contains(&0x1b) && !stdout.contains(&0x07),
        "{}{}",
        String::from_utf8_lossy(&stdout).escape_debug(),
        String::from_utf8_lossy(&stderr).escape_debug()
    );
    assert!(
        String::from_utf8_lossy(&stdout).contains("imports:\n  url=<x"),
        "{}",
        String::from_utf8_lossy(&stdout).escape_debug()
    );
}
