//! Host-side bindings generated from `wit/trainable.wit`.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "trainable",
});
