//! Checking a component against the `wtune:trainable` world before running
//! it, and describing any component for `wtune inspect`.

use std::fmt;

use wasmtime::Engine;
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

use super::wit_text;

/// The world every trainable must export, with the signatures users see in
/// `wit/trainable.wit`, for error messages.
pub(crate) const REQUIRED_EXPORTS: [(&str, &str); 6] = [
    ("setup", "func(config: string) -> result<_, string>"),
    ("train", "func() -> result<report, string>"),
    ("save", "func() -> result<list<u8>, string>"),
    ("restore", "func(state: list<u8>) -> result<_, string>"),
    ("reset", "func(config: string) -> result<bool, string>"),
    ("cleanup", "func()"),
];

/// The world's name, as shown to users.
pub const WORLD: &str = "wtune:trainable/trainable@0.1.0";

/// Why a file is not a usable wtune trainable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContractError {
    /// The bytes are not WebAssembly at all.
    NotWasm { detail: String },
    /// A core module (e.g. built for wasm32-wasip1 or wasm32-unknown-unknown).
    CoreModule,
    /// A component that wasmtime could not compile or validate.
    Invalid { detail: String },
    /// Required exports are missing or are not functions.
    MissingExports { missing: Vec<String> },
    /// An export exists but its type differs from the world's.
    ExportType { detail: String },
    /// The component imports something the host does not provide.
    Imports { detail: String },
    /// An allowlist is configured and the component's digest is not on it.
    NotAllowed { digest: String, allowed: usize },
    /// Compiling the component overran a compile limit.
    CompileLimit { reason: String },
    /// The host could not compile the component for a reason of its own
    /// (the compile worker is missing or crashed).
    Compiler { detail: String },
}

impl fmt::Display for ContractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContractError::NotWasm { detail } => write!(f, "not a WebAssembly binary ({detail})"),
            ContractError::CoreModule => write!(
                f,
                "this is a core WebAssembly module, not a component; build the trainable with \
                 `cargo build --target wasm32-wasip2` (the wtune-guest SDK makes a component)"
            ),
            ContractError::Invalid { detail } => write!(f, "invalid component: {detail}"),
            ContractError::MissingExports { missing } => write!(
                f,
                "component does not fit the {WORLD} world: missing export{} {}; a Rust \
                 trainable exports them with `wtune_guest::export!(YourTrainable);` in its \
                 lib.rs (crate-type = [\"cdylib\"])",
                if missing.len() == 1 { "" } else { "s" },
                missing.join(", ")
            ),
            ContractError::ExportType { detail } => {
                write!(f, "component does not fit the {WORLD} world: {detail}")
            }
            ContractError::Imports { detail } => write!(
                f,
                "component needs imports wtune does not provide (wtune offers WASI 0.2 and \
                 wtune:trainable/host): {detail}"
            ),
            ContractError::NotAllowed { digest, allowed } => write!(
                f,
                "component blake3 {digest} is not on the allowlist ({allowed} allowed \
                 component{}); it was refused before compiling",
                if *allowed == 1 { "" } else { "s" }
            ),
            ContractError::CompileLimit { reason } => write!(f, "component refused: {reason}"),
            ContractError::Compiler { detail } => {
                write!(f, "cannot compile the component: {detail}")
            }
        }
    }
}

impl std::error::Error for ContractError {}

/// Classifies raw bytes before any compilation is attempted.
pub(crate) fn check_header(bytes: &[u8]) -> Result<(), ContractError> {
    let Some(header) = bytes.get(..8) else {
        return Err(ContractError::NotWasm {
            detail: format!("only {} bytes long", bytes.len()),
        });
    };
    if &header[..4] != b"\0asm" {
        let shown: Vec<String> = header[..4].iter().map(|b| format!("{b:02x}")).collect();
        return Err(ContractError::NotWasm {
            detail: format!(
                "starts with bytes {} instead of 00 61 73 6d",
                shown.join(" ")
            ),
        });
    }
    // Bytes 4..8: version (u16) and layer (u16); layer 0 is a core module.
    match header[6..8] {
        [0, 0] => Err(ContractError::CoreModule),
        [1, 0] => Ok(()),
        _ => Err(ContractError::NotWasm {
            detail: "unknown WebAssembly layer".into(),
        }),
    }
}

/// Checks that every export of the world is present as a function.
pub(crate) fn check_exports(engine: &Engine, component: &Component) -> Result<(), ContractError> {
    let ty = component.component_type();
    let exports: Vec<(String, ComponentItem)> = ty
        .exports(engine)
        .map(|(name, item)| (name.to_string(), item.ty))
        .collect();
    let missing: Vec<String> = REQUIRED_EXPORTS
        .iter()
        .filter(|(name, _)| {
            !exports
                .iter()
                .any(|(n, item)| n == name && matches!(item, ComponentItem::ComponentFunc(_)))
        })
        .map(|(name, sig)| format!("`{name}: {sig}`"))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(ContractError::MissingExports { missing })
    }
}

/// Refuses components that use the names wtune's snapshot instrumentation
/// reserves: a guest must not reach the host's snapshot sink, nor pose as
/// the accessor.
pub(crate) fn check_reserved(engine: &Engine, component: &Component) -> Result<(), ContractError> {
    let ty = component.component_type();
    if ty
        .imports(engine)
        .any(|(name, _)| name == crate::snapshot::SINK_IMPORT)
    {
        return Err(ContractError::Imports {
            detail: format!(
                "it imports `{}`, a name reserved for wtune's host",
                crate::snapshot::SINK_IMPORT
            ),
        });
    }
    if ty
        .exports(engine)
        .any(|(name, _)| name == crate::snapshot::ACCESS_EXPORT)
    {
        return Err(ContractError::ExportType {
            detail: format!(
                "it exports `{}`, a name reserved for wtune's host",
                crate::snapshot::ACCESS_EXPORT
            ),
        });
    }
    Ok(())
}

/// A component's imports and exports, and whether it fits the world.
#[derive(Debug, Clone)]
pub struct ComponentDescription {
    /// `(name, rendered type)` for each import.
    pub imports: Vec<(String, String)>,
    /// `(name, rendered type)` for each export.
    pub exports: Vec<(String, String)>,
    /// `Ok` when the component can run as a trainable, otherwise why not.
    pub fits: Result<(), ContractError>,
}

impl ComponentDescription {
    pub(crate) fn of(
        engine: &Engine,
        component: &Component,
        fits: Result<(), ContractError>,
    ) -> Self {
        let ty = component.component_type();
        Self {
            imports: ty
                .imports(engine)
                .map(|(name, item)| (name.to_string(), wit_text::item(&item.ty)))
                .collect(),
            exports: ty
                .exports(engine)
                .map(|(name, item)| (name.to_string(), wit_text::item(&item.ty)))
                .collect(),
            fits,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_classification() {
        assert!(matches!(
            check_header(b"hello world"),
            Err(ContractError::NotWasm { .. })
        ));
        assert!(matches!(
            check_header(b"\0as"),
            Err(ContractError::NotWasm { .. })
        ));
        assert_eq!(
            check_header(b"\0asm\x01\0\0\0"),
            Err(ContractError::CoreModule)
        );
        assert_eq!(check_header(b"\0asm\x0d\0\x01\0"), Ok(()));
    }
}
