//! A trainable component in plain wasmtime: the engine settings wtune's
//! sandbox uses (component model, the same stack limit) but without fuel
//! metering and epoch interruption, no limits, no log capture. The baseline
//! that `step` compares the metered sandbox with: what the instrumentation
//! costs, apart from compiling to wasm at all.

use std::path::Path;
use std::time::{Duration, Instant};

use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker, ResourceTable, Val};
use wasmtime::{Config, Engine, Store};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

struct Host {
    wasi: WasiCtx,
    table: ResourceTable,
}

impl WasiView for Host {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Times `steps` calls of `train()` after `setup(config)`, with `data`
/// mounted read-only at `/data/<name>`. The guest's `log` calls go nowhere;
/// its compute imports trap (so `math = "host"` cannot run here).
pub fn train_times(
    component: &Path,
    data: &[(&str, &Path)],
    config: &str,
    steps: usize,
) -> wasmtime::Result<Vec<Duration>> {
    let mut settings = Config::new();
    settings.wasm_component_model(true);
    settings.max_wasm_stack(1 << 20);
    let engine = Engine::new(&settings)?;
    let component = Component::from_file(&engine, component)?;
    let mut linker = Linker::<Host>::new(&engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    linker
        .instance("wtune:trainable/host@0.1.0")?
        .func_new("log", |_, _, _, _| Ok(()))?;
    // The compute interface traps: `math = "wasm"` never calls it. (Not
    // `define_unknown_imports_as_traps`, which would shadow WASI's
    // interfaces where the guest names another patch version of them.)
    let ty = component.component_type();
    for (name, item) in ty.imports(&engine) {
        let ComponentItem::ComponentInstance(interface) = item.ty else {
            continue;
        };
        if !name.starts_with("wtune:trainable/compute") {
            continue;
        }
        let mut instance = linker.instance(name)?;
        for (function, item) in interface.exports(&engine) {
            if let ComponentItem::ComponentFunc(_) = item.ty {
                let message = format!("{name}#{function} is not available here");
                instance.func_new(function, move |_, _, _, _| {
                    Err(wasmtime::Error::msg(message.clone()))
                })?;
            }
        }
    }

    let mut wasi = WasiCtxBuilder::new();
    for (name, dir) in data {
        wasi.preopened_dir(dir, format!("/data/{name}"), FsPerms::ReadOnly)?;
    }
    let mut store = Store::new(
        &engine,
        Host {
            wasi: wasi.build(),
            table: ResourceTable::new(),
        },
    );
    let instance = linker.instantiate(&mut store, &component)?;
    let setup = instance.get_typed_func::<(&str,), (Result<(), String>,)>(&mut store, "setup")?;
    let (set_up,) = setup.call(&mut store, (config,))?;
    set_up.map_err(|e| wasmtime::Error::msg(format!("setup: {e}")))?;
    let train = instance
        .get_func(&mut store, "train")
        .ok_or_else(|| wasmtime::Error::msg("no train export"))?;
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        let mut result = [Val::Bool(false)];
        let started = Instant::now();
        train.call(&mut store, &[], &mut result)?;
        times.push(started.elapsed());
        if let Val::Result(Err(e)) = &result[0] {
            return Err(wasmtime::Error::msg(format!("train: {e:?}")));
        }
    }
    Ok(times)
}
