//! Raw bindings generated from `wit/trainable.wit`. Trainable authors never
//! need these directly; [`crate::export!`] wires a [`crate::Trainable`] to them.

wit_bindgen::generate!({
    path: "../wit",
    world: "trainable",
    pub_export_macro: true,
    export_macro_name: "__export_trainable",
    default_bindings_module: "::wtune_guest::bindings",
    runtime_path: "::wtune_guest::__private::wit_bindgen::rt",
});
